"""Checks that the package's rooms import only downwards: a module imports modules of its
own room or of a lower layer, never of a higher one, and no room imports another room of
its own layer. Imports inside functions count too (they are where a higher layer would
sneak in). Exits 1, listing every offending import, when the layering is broken.

    python tools/import_layers.py            # checks python/ringreduce
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = "ringreduce"
ROOT = Path(__file__).resolve().parent.parent / "python" / PACKAGE

# Lowest first. A room is a top-level module or subpackage of ringreduce.
LAYERS: list[set[str]] = [
    {"_core", "_core_mpi", "errors"},  # the engine (C++) and the exceptions
    {"_env", "launch"},  # every setting read in one place; the process launcher
    {"_arrays"},  # any array as the engine sees it
    {"compression"},  # codecs, error feedback and the compression policy
    {"_comm"},  # Communicator, Work, init
    {"bucketing", "bench"},  # gradient buckets; the benchmark sweep
    {"model"},  # the cost model (reads the benchmark's size parser)
    {"torch"},  # the torch.distributed backend and GradSync
    {"torchft"},  # torchft's process group, over the torch backend
    {"__init__"},  # the package's face: import ringreduce as rr
    {"cli"},  # the ringreduce command
    {"__main__"},  # python -m ringreduce
]
LAYER = {room: i for i, rooms in enumerate(LAYERS) for room in rooms}

# Rooms inside a room, lowest first, checked the same way among themselves: a sub-room
# is the room's subpackage or module (ringreduce._comm.core.work -> "core").
SUBLAYERS: dict[str, list[set[str]]] = {
    "_comm": [
        {"__init__"},  # the room's docstring, importing nothing
        {"core"},  # what one call is made of: ops, shaping, issuer, refusal, work, p2p, ...
        # compressed collectives; agree, shrink, grow; engine communicators from MPI
        {"compressed", "membership", "mpi"},
        {"communicator"},  # Communicator, composing them
        {"bootstrap"},  # init and join: how a communicator is made
    ],
}
SUBLAYER = {
    room: {sub: i for i, subs in enumerate(layers) for sub in subs}
    for room, layers in SUBLAYERS.items()
}


def room_of(module: str) -> str:
    """'ringreduce._comm.core.work' -> '_comm'; 'ringreduce' -> '__init__'."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def subroom_of(module: str) -> str:
    """'ringreduce._comm.core.work' -> 'core'; 'ringreduce._comm' -> '__init__'."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 else "__init__"


def module_name(path: Path, root: Path = ROOT) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, absolute module) of every ringreduce import in the file."""
    here = module_name(path, root)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == PACKAGE]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != PACKAGE:
                continue
            if target == PACKAGE or (node.module is None and node.level):
                # "from . import x": the names are modules of that package.
                found += [(node.lineno, f"{target}.{a.name}") for a in node.names]
            else:
                found.append((node.lineno, target))
    return found


def check(root: Path = ROOT) -> list[str]:
    """Every import against the layers, and every room without one, as text."""
    problems = []
    for path in sorted(root.rglob("*.py")):
        mine = room_of(module_name(path, root)) if path.parent != root else path.stem
        if mine not in LAYER:
            problems.append(f"{path.relative_to(root.parent)}: room {mine!r} has no layer")
            continue
        here = module_name(path, root)
        for line, target in imports(path, root):
            theirs = room_of(target)
            if theirs == mine and mine in SUBLAYER:
                problems += _check_subrooms(path, root, line, here, target, SUBLAYER[mine])
                continue
            if theirs == mine or theirs not in LAYER:
                continue
            if LAYER[theirs] >= LAYER[mine]:
                how = "a higher" if LAYER[theirs] > LAYER[mine] else "another room of its"
                problems.append(
                    f"{path.relative_to(root.parent)}:{line}: {mine} imports {target} "
                    f"({theirs}: {how} layer)"
                )
    return problems


def _check_subrooms(
    path: Path, root: Path, line: int, here: str, target: str, layers: dict
) -> list[str]:
    """One import between two modules of a room that has sub-rooms."""
    mine, theirs = subroom_of(here), subroom_of(target)
    where = f"{path.relative_to(root.parent)}:{line}"
    if mine not in layers:
        return [f"{where}: sub-room {mine!r} of {room_of(here)} has no layer"]
    if theirs == mine or theirs not in layers:
        return []
    if layers[theirs] < layers[mine]:
        return []
    how = "a higher" if layers[theirs] > layers[mine] else "another sub-room of its"
    return [f"{where}: {mine} imports {target} ({theirs}: {how} layer)"]


def main() -> int:
    problems = check()
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} import(s) against the layers (see LAYERS in {Path(__file__).name})")
        return 1
    print(f"layers ok: {sum(1 for _ in ROOT.rglob('*.py'))} modules")
    return 0


if __name__ == "__main__":
    sys.exit(main())
