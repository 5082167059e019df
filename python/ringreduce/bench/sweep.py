"""The sweep of ``ringreduce bench``: the ranks' timing loop, and the launch of local
ranks when it is not started under a launcher."""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence
from typing import Any, Callable

import numpy as np

from .. import _core, _env
from ..errors import RingReduceError
from ..launch import launch
from . import options, report
from . import peers as bench_peers
from .data import (
    bus_factor,
    count_wrong,
    default_iters,
    default_warmup,
    expected_output,
    make_input,
    sweep_sizes,
)

__all__ = ["main"]

_VERSION = _core.build_info()["version"]  # the package's version, built into the engine


def _in_job() -> bool:
    """True when started as one rank of a job (ringreduce launch, torchrun or mpirun)."""
    return _env.launched_with_rank() or bench_peers.under_mpirun()


def main(argv: Sequence[str] | None = None, prog: str = "ringreduce bench") -> int:
    """Entry point of ``ringreduce bench``; returns the exit status (2: a bad argument,
    refused before any rank starts)."""
    args = options.parse(list(sys.argv[1:] if argv is None else argv), prog)
    if not _in_job():
        nprocs = args.nprocs or 1
        if args.nprocs is None:
            print(f"{prog}: no -n given, running 1 rank (busbw is 0 for one rank)", file=sys.stderr)
        cmd = [sys.executable, "-m", "ringreduce", "bench", *args.argv]
        return launch(nprocs, cmd, prefix=False, transport=args.transport)
    return _run(args)


# --------------------------------------------------------------------------------------
# The sweep (runs on every rank)

Row = report.Row


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


# Without -i, calls are timed back to back (OSU-style) for at least this long: twenty
# calls of a microsecond make a 20 us window, which one preemption of a rank (a
# scheduler tick, milliseconds) turns into a time a hundred times too long.
_WINDOW_SECONDS = 0.005
_MAX_ITERS = 100_000
_SETTLE_SECONDS = 0.005


def _timed(
    comm: Any, fn: Callable[[], Any], warmup: int, iters: int, adapt: bool
) -> tuple[float, int]:
    """(Mean seconds per call of fn on this rank, after warm-up, started together; the
    number of calls timed). ``adapt``: at least ``iters`` calls, and enough to fill
    _WINDOW_SECONDS on the slowest rank (every rank runs the same number)."""
    calls = max(warmup, 1)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    if adapt:
        # Warm up for _SETTLE_SECONDS on every rank (they agree, so all make the same
        # calls): after another system's round (Gloo's sleeps) a VM's cores wake slowly
        # for a while, and a probe taken then cut the timed calls to a few slow ones.
        while comm.all_reduce(np.array([time.perf_counter() - start]), "min")[0] < _SETTLE_SECONDS:
            for _ in range(calls):
                fn()
        probe = time.perf_counter()
        for _ in range(calls):
            fn()
        per_call = (time.perf_counter() - probe) / calls
        want = min(_MAX_ITERS, max(iters, math.ceil(_WINDOW_SECONDS / max(per_call, 1e-9))))
        iters = int(comm.all_reduce(np.array([want], dtype=np.int64), "max")[0])
    comm.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - start) / iters, iters


def _run(args: argparse.Namespace) -> int:
    if "mpi" in args.systems:
        try:
            # MPI must be initialized by mpi4py (thread level MULTIPLE) before ringreduce
            # touches it, or mpi4py would find it initialized at a level it did not ask for.
            from mpi4py import MPI  # noqa: F401
        except ImportError:
            pass  # open_peers reports it
    from .._comm.bootstrap import init

    try:
        comm = init(args.transport, timeout=args.timeout)
    except (RingReduceError, ValueError) as exc:
        # A setup problem (no such transport, rendezvous failed): one line, no traceback.
        rank = _env.launcher_rank() or "?"
        print(f"ringreduce bench: rank {rank}: init failed: {exc}", file=sys.stderr)
        return 1
    try:
        return _sweep(args, comm)
    finally:
        comm.close()


def _sweep(args: argparse.Namespace, comm: Any) -> int:
    world, rank, dtype = comm.world_size, comm.rank, args.dtype
    lead = rank == 0
    peers, notes = bench_peers.open_peers(args.systems, comm, args.op, args.timeout)
    sizes = sweep_sizes(args.min_bytes, args.max_bytes, args.step_factor, dtype.itemsize)
    factor = bus_factor(world)
    header = report.Header(dtype.name, args.op, peers)
    if lead:
        if args.nprocs is not None and args.nprocs != world:
            notes.append(f"-n {args.nprocs} ignored: already running as {world} ranks")
        iters_text = (
            f"{args.iters}"
            if args.iters
            else "20, fewer above 16 MB (256 MiB/size, min 5), more to fill 5 ms back to back"
        )
        print(f"# ringreduce bench: all_reduce  version {_VERSION}")
        print(f"# ranks {world}  transport {comm.transport}  dtype {dtype.name}  op {args.op}")
        print(
            f"# sizes {args.min_bytes}..{args.max_bytes} B x{args.step_factor}  "
            f"iters {iters_text}  rounds {args.rounds} (median, systems interleaved)  "
            f"check {'on' if args.check else 'off'}"
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
        size_rows = _measure(args, comm, peers, size, disabled)
        rows.extend(size_rows)
        progress.clear()
        if lead:
            print(header.row(size_rows, args.check), flush=True)
    if lead:
        for name, reason in disabled.items():
            notes.append(f"{name} failed ({reason}); its columns show nan from then on")
            print(f"# note: {notes[-1]}")
    wrong = sum(r["wrong"] or 0 for r in rows if r["system"] in ("ringreduce", "window"))
    if lead:
        report.footer(rows, wrong, args.check, [p.name for p in peers])
        meta = {
            "ranks": world,
            "transport": comm.transport,
            "dtype": dtype.name,
            "op": args.op,
            "version": _VERSION,
            "busbw_factor": factor,
            "notes": notes,
            "args": list(args.argv),
        }
        report.write_outputs(
            rows, meta, json_path=args.json, csv_path=args.csv, plot_path=args.plot
        )
    for peer in peers:
        peer.close()
    return 1 if wrong else 0


def _measure(
    args: argparse.Namespace,
    comm: Any,
    peers: list[Any],
    size: int,
    disabled: dict[str, str],
) -> list[Row]:
    """Times (and checks) one size on every system; returns its rows (same on all ranks).

    A comparison system that fails (MPI has no bfloat16; Gloo has no bfloat16 on CPU in
    older torch) is added to ``disabled`` with the reason and not run again.
    """
    dtype = args.dtype
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

    copy_target = np.empty_like(send)
    # (system, placement, call, where its input goes, where its result is)
    cases: list[tuple[str, str, Callable[[], Any], np.ndarray, np.ndarray]] = [
        ("ringreduce", "out-of-place", lambda: comm.all_reduce(send, op, out=recv), send, recv),
        ("ringreduce", "in-place", lambda: comm.all_reduce(work, op, out=work), work, work),
        # The machine's yardstick: one core copying the same bytes, on every rank at
        # once, timed like the rest (busbw reads against it).
        ("memcpy", "copy", lambda: np.copyto(copy_target, send), send, copy_target),
    ]
    for peer in peers:
        fn = peer.bind(work)
        source, result = (work, work) if peer.buffers is None else peer.buffers
        cases.append((peer.name, peer.placement, fn, source, result))
    times = np.zeros(len(cases), dtype=np.float64)
    wrongs = np.zeros(len(cases), dtype=np.int64)
    failed = np.zeros(len(cases), dtype=np.int64)
    errors: dict[str, str] = {}
    # Each case first checks one call on fresh input (the in-place ones then keep
    # reducing their own output, as nccl-tests does). Then every case is timed once per
    # round, the cases interleaved round by round, so that drift of the machine hits
    # them alike; each case's time is its median round.
    rounds: list[list[float]] = [[] for _ in cases]
    counts = [iters] * len(cases)  # calls timed per round, by case
    for i, (system, _placement, fn, source, buf) in enumerate(cases):
        if system in disabled:
            continue
        np.copyto(source, send)  # fresh input where the in-place cases reduce
        try:
            fn()
            wrongs[i] = check(buf) if system != "memcpy" else 0
        except Exception as exc:
            if system == "ringreduce":
                raise
            failed[i] = 1
            errors[system] = f"at {size} B: {type(exc).__name__}: {exc}"
    for _ in range(args.rounds):
        for i, (system, _placement, fn, _source, _buf) in enumerate(cases):
            if system in disabled or failed[i]:
                continue
            try:
                seconds, counts[i] = _timed(
                    comm, fn, max(warmup - 1, 0), iters, adapt=not args.iters
                )
                rounds[i].append(seconds)
            except Exception as exc:
                if system == "ringreduce":
                    raise
                failed[i] = 1
                errors[system] = f"at {size} B: {type(exc).__name__}: {exc}"
    for i, timings in enumerate(rounds):
        if timings and not failed[i]:
            times[i] = float(np.median(timings))
    times = comm.all_reduce(times, "max")
    # One call agrees on both the #wrong totals and which systems failed on any rank, so
    # every rank drops the same systems and none waits in a collective the others skip.
    totals = comm.all_reduce(np.concatenate([wrongs, failed]), "sum")
    wrongs, failed = totals[: len(cases)], totals[len(cases) :]
    for i, (system, _placement, _fn, _source, _buf) in enumerate(cases):
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
    ours: dict[str, float] = {}  # our busbw by placement: each system's ratio is to ours alike
    for i, (system, placement, _fn, _source, _buf) in enumerate(cases):
        t = float(times[i])
        algbw = size / t / 1e9 if t > 0 else math.nan
        row = dict(
            base,
            iters=counts[i],
            system=system,
            placement=placement,
            time_us=t * 1e6,
            algbw_gbs=algbw,
            # A copy has no bus: its bandwidth is bytes copied per second.
            busbw_gbs=algbw * (1.0 if system == "memcpy" else bus_factor(comm.world_size)),
            wrong=None
            if expected is None or system in disabled or system == "memcpy"
            else int(wrongs[i]),
        )
        if system == "ringreduce":
            ours[placement] = row["busbw_gbs"]
        if system != "ringreduce":
            same = ours.get(placement, ours.get("in-place"))
            row["ratio_ours"] = report.ratio(same, row["busbw_gbs"])
        rows.append(row)
    return rows


if __name__ == "__main__":
    sys.exit(main())
