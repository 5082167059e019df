"""``ringreduce bench``'s command line: the parser, and every check of its arguments.

`parse` checks everything a rank would otherwise trip over (sizes, counts, the dtype and
op, the transport, the systems to compare, the output files) before any rank starts, so
a mistake is one usage line naming the argument and exit status 2, not an empty table or
a traceback from every rank. Under a launcher (mpirun, torchrun) each rank runs the same
checks; only the first rank prints the message.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from .. import _core, _env
from .data import DTYPES, OPS, parse_size, resolve_dtype, sweep_sizes

__all__ = ["COMPARABLE", "build_parser", "parse", "without_nprocs"]

# The systems --compare knows, and what each needs.
COMPARABLE = ("mpi", "gloo", "window")
_TRANSPORTS = ("auto", "shm", "tcp", "mpi")
# Reductions the comparison systems have (neither MPI nor Gloo has an average).
_PEER_OPS = {"mpi": ("sum", "prod", "min", "max"), "gloo": ("sum", "prod", "min", "max")}

Refuse = Callable[[str], NoReturn]


def build_parser(prog: str = "ringreduce bench") -> argparse.ArgumentParser:
    """The argument parser of ``ringreduce bench``."""
    p = argparse.ArgumentParser(
        prog=prog,
        description="all_reduce bandwidth sweep, nccl-tests style (GB = 1e9 bytes).",
        epilog="Sizes take suffixes K, M and G (powers of 1024): -b 8 -e 256M. Examples:\n"
        "  ringreduce bench -n 4\n"
        "  mpirun -np 4 python -m ringreduce bench --compare mpi,gloo\n"
        "  ringreduce bench -n 2 -b 1K -e 1G -f 4 -d bfloat16 -o avg --json r.json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "-n", "--nprocs", type=int, help="launch N local ranks (default: 1; not under mpirun)"
    )
    p.add_argument("-b", "--min-bytes", type=_size, default=8, help="smallest size (default: 8)")
    p.add_argument(
        "-e", "--max-bytes", type=_size, default=64 << 20, help="largest size (default: 64M)"
    )
    p.add_argument(
        "-f", "--step-factor", type=int, default=2, help="size multiplier per row (default: 2)"
    )
    p.add_argument(
        "-d", "--dtype", default="float32", help=f"{', '.join(DTYPES)} (default: float32)"
    )
    p.add_argument("-o", "--op", default="sum", choices=OPS, help="default: sum")
    p.add_argument(
        "-w", "--warmup", type=int, help="warm-up calls incl. the checked one (default: 5..1)"
    )
    p.add_argument(
        "-i",
        "--iters",
        type=int,
        help="timed iterations (default: 20, fewer above 16 MB, and more for fast calls, "
        "to fill 5 ms back to back)",
    )
    p.add_argument(
        "-r",
        "--rounds",
        type=int,
        default=3,
        help="timed rounds, all systems interleaved round by round; the median round "
        "counts (default: 3)",
    )
    p.add_argument(
        "-c",
        "--check",
        type=int,
        default=1,
        choices=(0, 1),
        help="check every result, #wrong column (default: 1)",
    )
    p.add_argument(
        "--transport",
        help=f"{', '.join(_TRANSPORTS)} (default: $RINGREDUCE_TRANSPORT or auto)",
    )
    p.add_argument(
        "--timeout", type=float, default=60.0, help="per-call timeout, seconds (default: 60)"
    )
    p.add_argument(
        "--compare",
        default="",
        help="comma list of other systems: mpi (under mpirun), gloo (needs torch), window "
        "(ours on comm.empty arrays; one host) (default: none)",
    )
    p.add_argument("--json", metavar="PATH", help="write all rows as JSON")
    p.add_argument("--csv", metavar="PATH", help="write all rows as CSV")
    p.add_argument("--plot", metavar="PATH.png", help="plot busbw vs size (needs matplotlib)")
    return p


def _size(text: str) -> int:
    # argparse turns a ValueError into "invalid _size value"; say what a size is instead.
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse(argv: Sequence[str], prog: str = "ringreduce bench") -> argparse.Namespace:
    """Parses and checks ``argv``; exits with status 2 and a usage error naming the
    argument when any is wrong. The result carries ``dtype`` (a numpy dtype),
    ``transport`` (resolved: the option, else $RINGREDUCE_TRANSPORT, else "auto"),
    ``systems`` (the --compare list) and ``argv`` (the arguments less -n, for the ranks)."""
    parser = build_parser(prog)
    args = parser.parse_args(list(argv))

    def refuse(message: str) -> NoReturn:
        rank = _env.launcher_rank()
        if rank not in (None, "0"):  # under a launcher, one copy of the message is enough
            sys.exit(2)
        parser.error(message)

    _check_counts(args, refuse)
    try:
        args.dtype = resolve_dtype(args.dtype)
    except ValueError as exc:
        refuse(f"-d/--dtype: {exc}")
    if args.op == "avg" and args.dtype.kind in "iu":
        refuse(f"-o avg: avg is defined for floating dtypes only, not {args.dtype.name}")
    _check_sizes(args, refuse)
    args.transport = _check_transport(args.transport, refuse)
    args.systems = _check_compare(args, refuse)
    _check_outputs(args, refuse)
    args.argv = without_nprocs(argv)
    return args


def _check_counts(args: argparse.Namespace, refuse: Refuse) -> None:
    if args.nprocs is not None and args.nprocs < 1:
        refuse(f"-n/--nprocs must be at least 1, got {args.nprocs}")
    if args.warmup is not None and args.warmup < 0:
        refuse(f"-w/--warmup must be at least 0, got {args.warmup}")
    if args.iters is not None and args.iters < 1:
        refuse(f"-i/--iters must be at least 1, got {args.iters}")
    if args.rounds < 1:
        refuse(f"-r/--rounds must be at least 1, got {args.rounds}")
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        refuse(f"--timeout must be a positive number of seconds, got {args.timeout}")


def _check_sizes(args: argparse.Namespace, refuse: Refuse) -> None:
    if args.min_bytes < 1:
        refuse(f"-b/--min-bytes must be at least 1 byte, got {args.min_bytes}")
    if args.min_bytes > args.max_bytes:
        refuse(
            f"-b/--min-bytes ({args.min_bytes} B) is larger than -e/--max-bytes "
            f"({args.max_bytes} B): no size to measure"
        )
    if args.step_factor < 2:
        refuse(f"-f/--step-factor must be at least 2, got {args.step_factor}")
    sizes = sweep_sizes(args.min_bytes, args.max_bytes, args.step_factor, args.dtype.itemsize)
    if not sizes:
        refuse(
            f"-b/-e: no size from {args.min_bytes} to {args.max_bytes} B holds a whole "
            f"{args.dtype.name} element ({args.dtype.itemsize} B)"
        )


def _check_transport(option: str | None, refuse: Refuse) -> str:
    where = "--transport"
    transport = option
    if transport is None:
        transport, where = _env.transport_setting() or "auto", "RINGREDUCE_TRANSPORT"
    if transport not in _TRANSPORTS:
        refuse(f"{where}: unknown transport {transport!r} (choose from {', '.join(_TRANSPORTS)})")
    built = _core.build_info()["transports"]
    if transport != "auto" and transport not in built:
        refuse(
            f"{where} {transport}: this build has no {transport} transport (built: "
            f"{', '.join(built)}; docs/install.md says how to build it)"
        )
    return transport


def _check_compare(args: argparse.Namespace, refuse: Refuse) -> list[str]:
    systems = [s.strip().lower() for s in args.compare.split(",") if s.strip()]
    for name in systems:
        if name not in COMPARABLE:
            refuse(f"--compare: unknown system {name!r} (known: {', '.join(COMPARABLE)})")
        if systems.count(name) > 1:
            refuse(f"--compare: {name} is named twice")
        if args.op not in _PEER_OPS.get(name, OPS):
            refuse(f"--compare {name}: {name} has no {args.op!r} reduction")
    if "mpi" in systems:
        if not _env.launched_by_mpirun():
            refuse(
                "--compare mpi: MPI_Allreduce runs only under mpirun: "
                "mpirun -np N python -m ringreduce bench --compare mpi"
            )
        if importlib.util.find_spec("mpi4py") is None:
            refuse("--compare mpi needs mpi4py: pip install mpi4py")
    if "gloo" in systems and importlib.util.find_spec("torch") is None:
        refuse("--compare gloo needs torch: pip install torch (the CPU wheel is enough)")
    if "window" in systems and args.transport in ("tcp", "mpi"):
        refuse(
            f"--compare window: windows need every rank on one host over shared memory, "
            f"and the transport is {args.transport}"
        )
    return systems


def _check_outputs(args: argparse.Namespace, refuse: Refuse) -> None:
    for flag, path in (("--json", args.json), ("--csv", args.csv), ("--plot", args.plot)):
        if path is None:
            continue
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            refuse(f"{flag} {path}: no folder {folder}")
        if os.path.isdir(path):
            refuse(f"{flag} {path}: is a folder, not a file")
    if args.plot is not None and importlib.util.find_spec("matplotlib") is None:
        refuse("--plot needs matplotlib: pip install matplotlib")


def without_nprocs(argv: Sequence[str]) -> list[str]:
    """argv less any -n/--nprocs option, for the ranks we launch."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("-n", "--nprocs"):
            skip = True
        elif not (arg.startswith("--nprocs=") or (arg.startswith("-n") and arg[2:].isdigit())):
            out.append(arg)
    return out
