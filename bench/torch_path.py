"""What a torch.distributed call costs on ringreduce, against the engine's own call, a
process group that does nothing (torch's dispatch alone), Gloo and DeepSpeed's shared-memory
all-reduce, on the same ranks in one run.

    ringreduce launch -n 2 --transport shm -- python bench/torch_path.py
    ringreduce launch -n 2 -- python bench/torch_path.py --sizes 8,64K,1M,16M --rounds 5

Rows, each timed OSU-style (calls back to back, after a warm-up; the median of --rounds
rounds, the rows interleaved round by round; the slowest rank's mean per call):

- ``dist.all_reduce``: on a "ringreduce" group, a CPU float32 tensor in place;
- ``dist.all_reduce window``: the same on a tensor from ``ringreduce.torch.empty``;
- ``dist.all_reduce async``: ``async_op=True``, then ``wait()``;
- ``numpy comm.all_reduce``: the group's communicator on a numpy array, ``out=x``;
- ``do-nothing pg``: ``dist.all_reduce`` on a Python ProcessGroup whose allreduce returns
  a finished Work at once (8 B only: what torch's dispatch costs);
- ``gloo``: a Gloo group over the same ranks;
- ``deepspeed shm``: DeepSpeed's ``inference_all_reduce`` (float32), where DeepSpeed
  is installed with its CPU shared-memory op (``DS_ACCELERATOR=cpu``; the op is built
  on first use).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist

import ringreduce.torch as rrt
from ringreduce.bench import parse_size

_WINDOW_SECONDS = 0.05  # each round times calls back to back for at least this long


class _Done(dist._Work):
    def wait(self, timeout: Any = None) -> bool:
        return True


class _NoOp(dist.ProcessGroup):
    """torch's dispatch alone: allreduce returns a finished Work."""

    def __init__(self, rank: int, size: int):
        super().__init__(rank, size)
        self._done = _Done()

    def getBackendName(self) -> str:  # noqa: N802
        return "noop"

    def allreduce(self, tensors: Any, opts: Any = None) -> Any:
        return self._done


def _timed(fn: Callable[[], Any], barrier: Callable[[], Any]) -> float:
    for _ in range(5):
        fn()
    probe = time.perf_counter()
    for _ in range(5):
        fn()
    per_call = (time.perf_counter() - probe) / 5
    iters = max(20, min(100_000, int(_WINDOW_SECONDS / max(per_call, 1e-9))))
    # Every rank makes the same number of calls: the largest any rank wants.
    want = torch.tensor([iters], dtype=torch.int64)
    dist.all_reduce(want, op=dist.ReduceOp.MAX)
    iters = int(want)
    barrier()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - start) / iters


def _deepspeed() -> Any:
    """DeepSpeed's CPU shared-memory all-reduce (``deepspeed.comm.inference_all_reduce``),
    where deepspeed imports (run with DS_ACCELERATOR=cpu); None otherwise. Its op maps
    its workspace only when LOCAL_SIZE is the world size, and falls back to
    torch.distributed.all_reduce (here: ringreduce) when it cannot run: a call that
    falls back is reported, not timed."""
    os.environ.setdefault("LOCAL_SIZE", os.environ.get("LOCAL_WORLD_SIZE", "1"))
    try:
        import deepspeed
        import deepspeed.comm as dscomm
    except Exception:  # noqa: BLE001 - not installed, or it fails to import
        return None
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, verbose=False)
    probe = torch.ones(4)
    real, calls = dist.all_reduce, [0]

    def counting(*a: Any, **k: Any) -> Any:
        calls[0] += 1
        return real(*a, **k)

    dist.all_reduce = counting
    try:
        dscomm.inference_all_reduce(probe)
    finally:
        dist.all_reduce = real
    if calls[0] or not bool((probe == dist.get_world_size()).all()):
        print("# deepspeed shm skipped: its op fell back to torch.distributed", file=sys.stderr)
        return None
    return dscomm


def _communicator() -> Any:
    """The default group's communicator (``ringreduce.torch.communicator`` where it exists)."""
    if hasattr(rrt, "communicator"):
        return rrt.communicator()
    return dist.distributed_c10d._get_default_group().comm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="8,64K,1M,16M")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-gloo", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rrt.init_process_group("ringreduce")
    rank, world = dist.get_rank(), dist.get_world_size()
    dist.Backend.register_backend("noop", lambda store, r, n, t: _NoOp(r, n), devices=["cpu"])
    noop = dist.new_group(backend="noop")
    gloo = None if args.no_gloo else dist.new_group(backend="gloo")
    comm = _communicator()
    ds = _deepspeed()
    barrier = comm.barrier
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    rows: dict[str, dict[int, list[float]]] = {}

    def add(name: str, size: int, fn: Callable[[], Any]) -> None:
        rows.setdefault(name, {}).setdefault(size, []).append(_timed(fn, barrier))

    for _ in range(args.rounds):
        for size in sizes:
            n = max(size // 4, 1)
            t = torch.ones(n)
            a = np.ones(n, np.float32)
            add("dist.all_reduce", size, lambda t=t: dist.all_reduce(t))
            if hasattr(rrt, "empty"):
                w = rrt.empty(n)
                w.fill_(1)
                add("dist.all_reduce window", size, lambda w=w: dist.all_reduce(w))
                del w
            add("dist.all_reduce async", size, lambda t=t: dist.all_reduce(t, async_op=True).wait())
            add("numpy comm.all_reduce", size, lambda a=a: comm.all_reduce(a, out=a))
            if size == sizes[0]:
                add("do-nothing pg", size, lambda t=t: dist.all_reduce(t, group=noop))
            if gloo is not None:
                add("gloo", size, lambda t=t: dist.all_reduce(t, group=gloo))
            if ds is not None:
                add(
                    "deepspeed shm", size, lambda t=t: ds.inference_all_reduce(t, dist.ReduceOp.SUM)
                )
    if rank == 0:
        print(
            f"# {world} ranks, transport {comm.transport}, float32, us per call "
            f"(median of {args.rounds} rounds; slowest rank)"
        )
    width = max(len(name) for name in rows)
    header = " ".join(f"{s:>10d}" for s in sizes)
    if rank == 0:
        print(f"{'':{width}s} {header}")
    for name, by_size in rows.items():
        cells = []
        for size in sizes:
            if size not in by_size:
                cells.append(f"{'':>10s}")
                continue
            mine = torch.tensor([statistics.median(by_size[size])], dtype=torch.float64)
            dist.all_reduce(mine, op=dist.ReduceOp.MAX)
            cells.append(f"{float(mine) * 1e6:10.2f}")
        if rank == 0:
            print(f"{name:{width}s} {' '.join(cells)}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
