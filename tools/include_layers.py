"""Checks that the engine's folders include only downwards: a file under csrc/<folder>/
includes headers of its own folder or of a lower layer, never of a higher one or of
another folder of its own layer, so no two folders include each other. Exits 1, listing
every offending include, when the layering is broken.

    python tools/include_layers.py           # checks csrc/
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "csrc"
SOURCES = (".h", ".cc", ".cu", ".cuh")

# Lowest first. A folder is a directory directly under csrc/.
LAYERS: list[set[str]] = [
    {"common"},  # errors, deadlines, dtypes, sockets, liveness, SHA-256
    {"security", "reduce"},  # the job's secret and its proofs; the CPU reduction kernels
    {"kernels"},  # codecs and device kernels over the reductions
    {"rendezvous"},  # stores: how ranks find each other
    {"transport"},  # shm, tcp, mpi, routed; the waiter
    {"executor"},  # the memory a schedule runs on: host, device
    {"algorithms"},  # every collective's schedule, once, over an executor
    {"engine"},  # the communicator: the choice, the dispatch, works, failures
    {"testing"},  # hooks the tests drive the engine through
    {"bindings"},  # the Python module
]
LAYER = {folder: i for i, folders in enumerate(LAYERS) for folder in folders}

_INCLUDE = re.compile(r'^\s*#\s*include\s+"([A-Za-z0-9_]+)/', re.MULTILINE)


def includes(path: Path) -> list[tuple[int, str]]:
    """(line, folder) of every include of a csrc header in a folder ("x/y.h" -> "x")."""
    text = path.read_text(encoding="utf-8", errors="replace")
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in _INCLUDE.finditer(text)]


def check(root: Path = ROOT) -> list[str]:
    """Every include against the layers, and every folder without one, as text."""
    problems = []
    for path in sorted(p for p in root.rglob("*") if p.suffix in SOURCES):
        rel = path.relative_to(root)
        if len(rel.parts) < 2:
            continue  # csrc/config.h and the like: below every folder
        mine = rel.parts[0]
        if mine not in LAYER:
            problems.append(f"{rel}: folder {mine!r} has no layer")
            continue
        for line, theirs in includes(path):
            if theirs == mine or theirs not in LAYER:
                continue
            if LAYER[theirs] >= LAYER[mine]:
                how = "a higher" if LAYER[theirs] > LAYER[mine] else "another folder of its"
                problems.append(f"{rel}:{line}: {mine} includes {theirs}/ ({how} layer)")
    return problems


def main() -> int:
    problems = check()
    for p in problems:
        print(p)
    if problems:
        print(
            f"{len(problems)} include(s) against the layers (see LAYERS in {Path(__file__).name})"
        )
        return 1
    print(f"layers ok: {sum(1 for p in ROOT.rglob('*') if p.suffix in SOURCES)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
