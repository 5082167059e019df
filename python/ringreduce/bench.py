"""``ringreduce bench``: all_reduce bandwidth sweep in the style of nccl-tests.

``ringreduce bench -n 4`` launches 4 local ranks (through ``ringreduce.launch``) and rank 0
prints one row per message size: the mean per-iteration time (the maximum over ranks),
algorithm bandwidth ``algbw = size / time`` and bus bandwidth
``busbw = algbw * 2(N-1)/N`` (GB = 1e9 bytes), for out-of-place and in-place calls, each
with ``#wrong``, the number of result elements (summed over ranks) that differ from the
exact expected value. Under ``mpirun`` or ``ringreduce launch`` it runs directly.

``--compare mpi,gloo`` times ``MPI_Allreduce`` (mpi4py; under mpirun only) and
torch.distributed's Gloo backend on the same buffers and sizes, in the same process, one
right after the other, and prints their time and busbw with the ratio ours/theirs.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import time
from collections.abc import Sequence
from typing import Any, Callable

import numpy as np

from . import _bench_peers, _bench_report
from .launch import launch

__all__ = [
    "bus_factor",
    "count_wrong",
    "default_iters",
    "default_warmup",
    "expected_output",
    "main",
    "make_input",
    "parse_size",
    "resolve_dtype",
    "sweep_sizes",
]

_OPS = ("sum", "prod", "min", "max", "avg")
_DTYPE_ALIASES = {
    "half": "float16",
    "fp16": "float16",
    "bf16": "bfloat16",
    "float": "float32",
    "fp32": "float32",
    "double": "float64",
    "fp64": "float64",
    "int": "int32",
    "char": "int8",
}
_DTYPES = ("float16", "bfloat16", "float32", "float64", "int8", "uint8", "int32", "int64")
# Machine epsilon of the floating dtypes; "avg" divides by N, which need not be exact.
_EPS = {"float16": 2.0**-10, "bfloat16": 2.0**-7, "float32": 2.0**-23, "float64": 2.0**-52}
# Input values repeat with this period along the array and are shifted by the rank, so a
# block placed at the wrong offset or taken from the wrong rank shows up as #wrong.
_PERIOD = 7
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)


# --------------------------------------------------------------------------------------
# Pure helpers (unit-tested on their own)


def parse_size(text: str) -> int:
    """Parses a byte count such as ``8``, ``256K``, ``64M``, ``1G`` (powers of 1024)."""
    m = _SIZE_RE.match(str(text))
    if not m:
        raise ValueError(f"not a size: {text!r} (examples: 8, 256K, 64M, 1G)")
    scale = 1024 ** "bkmgt".index(m.group(2).lower() or "b")
    return int(float(m.group(1)) * scale)


def sweep_sizes(min_bytes: int, max_bytes: int, factor: int, itemsize: int) -> list[int]:
    """Message sizes from min_bytes to max_bytes multiplying by factor, like nccl-tests.

    Each size is rounded down to whole elements; sizes below one element are dropped.
    """
    if factor < 2:
        raise ValueError(f"step factor must be >= 2, got {factor}")
    sizes: list[int] = []
    size = max(min_bytes, 1)
    while size <= max_bytes:
        aligned = size - size % itemsize
        if aligned > 0 and (not sizes or aligned != sizes[-1]):
            sizes.append(aligned)
        size *= factor
    return sizes


def default_iters(size: int) -> int:
    """Timed iterations when -i is not given: 20 for small messages, down to 5 at 64 MB.

    Small messages are latency-bound and noisy, so they get many iterations; large ones
    are stable and expensive (a 64 MB call takes tenths of a second over loopback TCP on a
    small machine), so about 256 MiB per size is moved.
    """
    return int(min(20, max(5, (256 << 20) // max(size, 1))))


def default_warmup(size: int) -> int:
    """Warm-up iterations when -w is not given: 5 for small messages, 1 for large ones."""
    return int(min(5, max(1, (32 << 20) // max(size, 1))))


def bus_factor(world_size: int) -> float:
    """busbw / algbw for all_reduce: each rank sends 2(N-1)/N of the message."""
    return 2.0 * (world_size - 1) / world_size


def _pattern(op: str, rank: int) -> np.ndarray:
    """One period of a rank's input values, as float64 (exact small integers)."""
    k = (rank + np.arange(_PERIOD)) % _PERIOD
    if op == "prod":
        # Mostly ones, with a 2 from about one rank in seven: products stay exact powers
        # of two in every dtype for any practical rank count.
        return np.where(k == 0, 2.0, 1.0)
    return (k + 1).astype(np.float64)


def make_input(count: int, dtype: np.dtype, op: str, rank: int) -> np.ndarray:
    """This rank's input: small integers, exactly representable in every dtype."""
    return np.resize(_pattern(op, rank).astype(dtype), count)


def expected_output(count: int, dtype: np.dtype, op: str, world_size: int) -> np.ndarray:
    """The exact all_reduce result of make_input over world_size ranks."""
    table = np.stack([_pattern(op, r) for r in range(world_size)])
    if np.dtype(dtype).kind in "iu":
        # Integer sums and products wrap modulo 2**bits, in any order of reduction.
        reduced = _reduce_table(table.astype(np.int64), op).astype(dtype)
    else:
        reduced = _reduce_table(table, op).astype(dtype)
    return np.resize(reduced, count)


def _reduce_table(table: np.ndarray, op: str) -> np.ndarray:
    if op == "sum":
        return table.sum(axis=0)
    if op == "prod":
        return table.prod(axis=0)
    if op == "min":
        return table.min(axis=0)
    if op == "max":
        return table.max(axis=0)
    if op == "avg":
        return table.sum(axis=0) / table.shape[0]
    raise ValueError(f"unknown op {op!r}")


def count_wrong(result: np.ndarray, expected: np.ndarray, op: str) -> int:
    """Elements of result that differ from expected.

    Exact (0 ULP) except for "avg" on floating dtypes, which may be off by up to 2 ULP
    because dividing by N can round (the nccl-tests tolerance for AVG).
    """
    if op == "avg" and result.dtype.name in _EPS:
        tol = 2 * _EPS[result.dtype.name] * np.abs(expected.astype(np.float64))
        diff = np.abs(result.astype(np.float64) - expected.astype(np.float64))
        return int(np.count_nonzero(~(diff <= tol)))
    return int(np.count_nonzero(result != expected))


def resolve_dtype(name: str) -> np.dtype:
    """numpy dtype for a -d value; bfloat16 comes from ml_dtypes."""
    name = _DTYPE_ALIASES.get(name.lower(), name.lower())
    if name not in _DTYPES:
        raise ValueError(f"unsupported dtype {name!r} (choose from {', '.join(_DTYPES)})")
    if name == "bfloat16":
        try:
            import ml_dtypes
        except ImportError as exc:
            raise ValueError("bfloat16 needs ml_dtypes: pip install ml_dtypes") from exc
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


# --------------------------------------------------------------------------------------
# Command line


def build_parser(prog: str = "ringreduce bench") -> argparse.ArgumentParser:
    """The argument parser of ``ringreduce bench``."""
    p = argparse.ArgumentParser(
        prog=prog,
        description="all_reduce bandwidth sweep, nccl-tests style (GB = 1e9 bytes).",
    )
    p.add_argument("-n", "--nprocs", type=int, help="launch N local ranks (default: 1)")
    p.add_argument("-b", "--min-bytes", type=parse_size, default=8, help="default: 8")
    p.add_argument("-e", "--max-bytes", type=parse_size, default=64 << 20, help="default: 64M")
    p.add_argument("-f", "--step-factor", type=int, default=2, help="default: 2")
    p.add_argument("-d", "--dtype", default="float32", help=f"{', '.join(_DTYPES)}")
    p.add_argument("-o", "--op", default="sum", choices=_OPS, help="default: sum")
    p.add_argument(
        "-w", "--warmup", type=int, help="warm-up calls incl. the checked one (default: 5..1)"
    )
    p.add_argument(
        "-i", "--iters", type=int, help="timed iterations (default: 20, fewer above 16 MB)"
    )
    p.add_argument("-c", "--check", type=int, default=1, choices=(0, 1), help="default: 1")
    p.add_argument("--transport", help="tcp, mpi or auto (default: $RINGREDUCE_TRANSPORT or auto)")
    p.add_argument("--timeout", type=float, default=60.0, help="per-call timeout, seconds")
    p.add_argument("--compare", default="", help="comma list of other systems: mpi,gloo")
    p.add_argument("--json", metavar="PATH", help="write all rows as JSON")
    p.add_argument("--csv", metavar="PATH", help="write all rows as CSV")
    p.add_argument("--plot", metavar="PATH.png", help="plot busbw vs size (needs matplotlib)")
    return p


def _in_job() -> bool:
    """True when started as one rank of a job (ringreduce launch, torchrun or mpirun)."""
    launched = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    return launched or _bench_peers.under_mpirun()


def _without_nprocs(argv: Sequence[str]) -> list[str]:
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


def main(argv: Sequence[str] | None = None, prog: str = "ringreduce bench") -> int:
    """Entry point of ``ringreduce bench``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    try:
        dtype = resolve_dtype(args.dtype)
    except ValueError as exc:
        parser.error(str(exc))
    if args.op == "avg" and dtype.kind in "iu":
        parser.error("avg is defined for floating dtypes only")
    if args.nprocs is not None and args.nprocs < 1:
        parser.error("-n must be at least 1")
    args.argv = _without_nprocs(argv)
    if not _in_job():
        nprocs = args.nprocs or 1
        if args.nprocs is None:
            print(f"{prog}: no -n given, running 1 rank (busbw is 0 for one rank)", file=sys.stderr)
        cmd = [sys.executable, "-m", "ringreduce", "bench", *args.argv]
        return launch(nprocs, cmd, prefix=False, transport=args.transport)
    return _run(args, dtype)


# --------------------------------------------------------------------------------------
# The sweep (runs on every rank)

Row = _bench_report.Row


class _Progress:
    """Progress on stderr: a rewritten line on a terminal, a line every 10 s otherwise.

    On a terminal the line names the size being measured and is erased before each table
    row, so stdout and stderr sharing the screen do not garble each other.
    """

    def __init__(self, total: int, enabled: bool):
        self.total = total
        self.enabled = enabled
        self.tty = enabled and sys.stderr.isatty()
        self.last = time.monotonic()

    def start(self, index: int, size: int) -> None:
        """Announces that size number index (1-based) is being measured."""
        if not self.enabled:
            return
        text = f"ringreduce bench: measuring {size} B ({index}/{self.total})"
        if self.tty:
            print(f"\r\033[K{text}", end="", file=sys.stderr, flush=True)
        elif time.monotonic() - self.last >= 10.0:
            print(text, file=sys.stderr, flush=True)
            self.last = time.monotonic()

    def clear(self) -> None:
        """Erases the terminal line (before stdout writes there)."""
        if self.tty:
            print("\r\033[K", end="", file=sys.stderr, flush=True)


def _timed(comm: Any, fn: Callable[[], Any], warmup: int, iters: int) -> float:
    """Mean seconds per call of fn on this rank, after warm-up, started together."""
    for _ in range(warmup):
        fn()
    comm.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - start) / iters


def _run(args: argparse.Namespace, dtype: np.dtype) -> int:
    compare = [s.strip().lower() for s in args.compare.split(",") if s.strip()]
    if "mpi" in compare and _bench_peers.under_mpirun():
        try:
            # MPI must be initialized by mpi4py (thread level MULTIPLE) before ringreduce
            # touches it, or mpi4py would find it initialized at a level it did not ask for.
            from mpi4py import MPI  # noqa: F401
        except ImportError:
            pass  # open_peers reports it
    import ringreduce as rr

    transport = args.transport or os.environ.get("RINGREDUCE_TRANSPORT") or "auto"
    try:
        comm = rr.init(transport, timeout=args.timeout)
    except (rr.RingReduceError, ValueError) as exc:
        # A setup problem (no such transport, rendezvous failed): one line, no traceback.
        rank = os.environ.get("RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or "?"
        print(f"ringreduce bench: rank {rank}: init failed: {exc}", file=sys.stderr)
        return 1
    try:
        return _sweep(args, dtype, comm, compare)
    finally:
        comm.close()


def _sweep(args: argparse.Namespace, dtype: np.dtype, comm: Any, compare: list[str]) -> int:
    import ringreduce as rr

    world, rank = comm.world_size, comm.rank
    lead = rank == 0
    peers, notes = _bench_peers.open_peers(compare, comm, args.op, args.timeout)
    sizes = sweep_sizes(args.min_bytes, args.max_bytes, args.step_factor, dtype.itemsize)
    factor = bus_factor(world)
    header = _bench_report.Header(dtype.name, args.op, peers)
    if lead:
        if args.nprocs is not None and args.nprocs != world:
            notes.append(f"-n {args.nprocs} ignored: already running as {world} ranks")
        iters_text = (
            f"{args.iters}" if args.iters else "20, fewer above 16 MB (256 MiB/size, min 5)"
        )
        print(f"# ringreduce bench: all_reduce  version {rr.__version__}")
        print(f"# ranks {world}  transport {comm.transport}  dtype {dtype.name}  op {args.op}")
        print(
            f"# sizes {args.min_bytes}..{args.max_bytes} B x{args.step_factor}  "
            f"iters {iters_text}  check {'on' if args.check else 'off'}"
        )
        print(
            f"# busbw = algbw * 2(N-1)/N = algbw * {factor:.4f}; GB = 1e9 bytes; time = max "
            "over ranks of the mean per-iteration time"
        )
        for note in notes:
            print(f"# note: {note}")
        print("#")
        header.print()
        sys.stdout.flush()
    progress = _Progress(len(sizes), lead)
    rows: list[Row] = []
    disabled: dict[str, str] = {}
    for index, size in enumerate(sizes, 1):
        progress.start(index, size)
        size_rows = _measure(args, dtype, comm, peers, size, disabled)
        rows.extend(size_rows)
        progress.clear()
        if lead:
            print(header.row(size_rows, args.check), flush=True)
    if lead:
        for name, reason in disabled.items():
            notes.append(f"{name} failed ({reason}); its columns show nan from then on")
            print(f"# note: {notes[-1]}")
    wrong = sum(r["wrong"] or 0 for r in rows if r["system"] == "ringreduce")
    if lead:
        _bench_report.footer(rows, wrong, args.check, [p.name for p in peers])
        meta = {
            "ranks": world,
            "transport": comm.transport,
            "dtype": dtype.name,
            "op": args.op,
            "version": rr.__version__,
            "busbw_factor": factor,
            "notes": notes,
            "args": list(args.argv),
        }
        _bench_report.write_outputs(
            rows, meta, json_path=args.json, csv_path=args.csv, plot_path=args.plot
        )
    for peer in peers:
        peer.close()
    return 1 if wrong else 0


def _measure(
    args: argparse.Namespace,
    dtype: np.dtype,
    comm: Any,
    peers: list[Any],
    size: int,
    disabled: dict[str, str],
) -> list[Row]:
    """Times (and checks) one size on every system; returns its rows (same on all ranks).

    A comparison system that fails (MPI has no bfloat16; Gloo has no bfloat16 on CPU in
    older torch) is added to ``disabled`` with the reason and not run again.
    """
    count = size // dtype.itemsize
    warmup = args.warmup if args.warmup is not None else default_warmup(size)
    iters = args.iters or default_iters(size)
    op = args.op
    send = make_input(count, dtype, op, comm.rank)
    recv = np.zeros_like(send)
    work = np.empty_like(send)
    expected = expected_output(count, dtype, op, comm.world_size) if args.check else None

    def check(buf: np.ndarray) -> int:
        return -1 if expected is None else count_wrong(buf, expected, op)

    cases: list[tuple[str, str, Callable[[], Any], np.ndarray]] = [
        ("ringreduce", "out-of-place", lambda: comm.all_reduce(send, op, out=recv), recv),
        ("ringreduce", "in-place", lambda: comm.all_reduce(work, op, out=work), work),
    ]
    for peer in peers:
        cases.append((peer.name, "in-place", peer.bind(work), work))
    times = np.zeros(len(cases), dtype=np.float64)
    wrongs = np.zeros(len(cases), dtype=np.int64)
    failed = np.zeros(len(cases), dtype=np.int64)
    errors: dict[str, str] = {}
    for i, (system, _placement, fn, buf) in enumerate(cases):
        if system in disabled:
            continue
        # Each case checks one call on fresh input, then times warm-up + iters calls (the
        # in-place ones keep reducing their own output, as nccl-tests does).
        np.copyto(work, send)
        try:
            fn()
            wrongs[i] = check(buf)
            times[i] = _timed(comm, fn, max(warmup - 1, 0), iters)
        except Exception as exc:
            if system == "ringreduce":
                raise
            failed[i] = 1
            errors[system] = f"at {size} B: {type(exc).__name__}: {exc}"
    times = comm.all_reduce(times, "max")
    # One call agrees on both the #wrong totals and which systems failed on any rank, so
    # every rank drops the same systems and none waits in a collective the others skip.
    totals = comm.all_reduce(np.concatenate([wrongs, failed]), "sum")
    wrongs, failed = totals[: len(cases)], totals[len(cases) :]
    for i, (system, _placement, _fn, _buf) in enumerate(cases):
        if failed[i] and system not in disabled:
            disabled[system] = errors.get(system, f"at {size} B on another rank")
            if comm.rank == 0:
                print(f"ringreduce bench: {system} failed {disabled[system]}", file=sys.stderr)
        if system in disabled:
            times[i] = math.nan
    rows: list[Row] = []
    base = {
        "size": size,
        "count": count,
        "dtype": dtype.name,
        "op": op,
        "ranks": comm.world_size,
        "warmup": warmup,
        "iters": iters,
    }
    ours_inplace = None
    for i, (system, placement, _fn, _buf) in enumerate(cases):
        t = float(times[i])
        algbw = size / t / 1e9 if t > 0 else math.nan
        row = dict(
            base,
            system=system,
            placement=placement,
            time_us=t * 1e6,
            algbw_gbs=algbw,
            busbw_gbs=algbw * bus_factor(comm.world_size),
            wrong=None if expected is None or system in disabled else int(wrongs[i]),
        )
        if system == "ringreduce" and placement == "in-place":
            ours_inplace = row["busbw_gbs"]
        if system != "ringreduce":
            row["ratio_ours"] = _bench_report.ratio(ours_inplace, row["busbw_gbs"])
        rows.append(row)
    return rows


if __name__ == "__main__":
    sys.exit(main())
