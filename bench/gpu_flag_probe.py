"""What one barrier between two processes on one GPU costs, signalled three ways.

    python bench/gpu_flag_probe.py [--iters 2000] [--timeout 4] [--no-mps]

The device window all_reduce meets its peers twice a call, and today the host does
it: a device synchronize, then a word of shared memory. Moving those phases into the
device's own queue (flags in memory the GPU reads and writes) is worth it only if a
wait there is cheaper where ranks time-slice one GPU. This measures it: two processes
on GPU 0 pass barriers through a 64-bit flag each, in a shared host page, the way
testing/flag_probe.h describes:

  host    a one-thread kernel, a stream synchronize, then the host writes and waits
          (what the window path does per phase);
  memops  the same kernel, then the stream writes our flag and waits on the peer's
          (cuStreamWriteValue64 / cuStreamWaitValue64): no host in the loop;
  spin    one kernel spinning on the flags for every barrier (a persistent kernel).

Then the same under MPS, where nvidia-cuda-mps-control is on PATH (a daemon of its
own, bench/_mps.py, stopped at the end; --no-mps skips it). Each cell is
the slower process's microseconds per barrier, and how many of the barriers passed
before the deadline. Needs ringreduce built with CUDA and a GPU (exit status 2
without); torch is not used. RR_FLAG_PROBE_FAKE=1 passes the barriers in Python on
the host instead, so that tests check the harness on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
from typing import Any, Dict, List, Optional

from _mps import environment, mps_daemon  # bench/, this script's directory

MODES = ("host", "memops", "spin")
PAGE = 4096


def _fake_probe(words: Any, rank: int, first: int, iters: int, timeout: float) -> Dict:
    """The barriers without a GPU: the host writes and spins (RR_FLAG_PROBE_FAKE=1)."""
    import time

    mine, theirs = 16 * rank, 16 * (1 - rank)
    start = time.perf_counter()
    completed, timed_out = 0, False
    for i in range(iters):
        words[mine] = first + i
        while int(words[theirs]) < first + i:
            if time.perf_counter() - start > timeout:
                timed_out = True
                break
        if timed_out:
            break
        completed = i + 1
    return {"seconds": time.perf_counter() - start, "completed": completed, "timed_out": timed_out}


def _rank(rank: int, name: str, iters: int, timeout: float, start: Any, queue: Any) -> None:
    from multiprocessing import shared_memory

    import numpy as np

    from ringreduce import _core

    page = shared_memory.SharedMemory(name=name)
    words = np.frombuffer(page.buf, dtype=np.uint64)
    result: Dict[str, Dict[str, Any]] = {}
    try:
        for k, mode in enumerate(MODES):
            start.wait(timeout + 30)  # both ranks start each way together
            # Each way counts from above anything the flags held before.
            first = 1 + k * (iters + 1)
            try:
                if os.environ.get("RR_FLAG_PROBE_FAKE") == "1":
                    result[mode] = _fake_probe(words, rank, first, iters, timeout)
                else:
                    result[mode] = dict(
                        _core.testing.cuda_flag_probe(
                            mode, words.ctypes.data, PAGE, rank, first, iters, timeout
                        )
                    )
            except Exception as e:  # reported in the table, the other ways still run
                result[mode] = {"error": f"{type(e).__name__}: {e}"}
    finally:
        del words
        page.close()
        queue.put((rank, result))


def run_pair(iters: int, timeout: float, env: Optional[Dict[str, str]] = None) -> List[Dict]:
    """Both ranks' results, by rank; `env` is set for the two processes only."""
    from multiprocessing import shared_memory

    page = shared_memory.SharedMemory(create=True, size=PAGE)
    page.buf[:PAGE] = bytes(PAGE)
    ctx = mp.get_context("spawn")
    try:
        queue, start = ctx.Queue(), ctx.Barrier(2)
        procs = [
            # Daemons: a rank stuck in the driver must not keep the harness from exiting
            # (gpu_check's timeout would then take the whole step).
            ctx.Process(
                target=_rank, args=(r, page.name, iters, timeout, start, queue), daemon=True
            )
            for r in range(2)
        ]
        with environment(env or {}):
            for p in procs:
                p.start()
        budget = len(MODES) * (timeout + 10) + 30
        results: List[Dict] = [{}, {}]
        for _ in procs:
            rank, result = queue.get(timeout=budget)
            results[rank] = result
        for p in procs:
            p.join(timeout=10)
        return results
    finally:
        page.close()
        page.unlink()


def cells(results: List[Dict], iters: int) -> List[str]:
    out = []
    for mode in MODES:
        rows = [r.get(mode, {"error": "no result"}) for r in results]
        errors = [r["error"] for r in rows if "error" in r]
        if errors:
            out.append(f"{mode}: {errors[0]}")
            continue
        passed = min(r["completed"] for r in rows)
        if passed == 0:
            out.append(f"{mode}: no barrier passed in {max(r['seconds'] for r in rows):.1f} s")
            continue
        us = max(r["seconds"] / r["completed"] for r in rows) * 1e6
        late = " (deadline)" if any(r["timed_out"] for r in rows) else ""
        out.append(f"{mode} {us:.1f} us ({passed}/{iters}{late})")
    return out


def with_mps(iters: int, timeout: float) -> str:
    with mps_daemon() as (env, why):
        if env is None:
            return f"MPS: {why}"
        return "MPS, " + ", ".join(cells(run_pair(iters, timeout, env), iters))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--timeout", type=float, default=4.0, help="seconds per way per rank")
    parser.add_argument("--no-mps", action="store_true")
    args = parser.parse_args()
    if args.iters < 1 or not args.timeout > 0:
        parser.error("--iters and --timeout must be positive")
    from ringreduce import _core

    if _core.cuda_device_count() == 0 and os.environ.get("RR_FLAG_PROBE_FAKE") != "1":
        print("gpu_flag_probe: needs ringreduce built with CUDA and a GPU", file=sys.stderr)
        return 2
    print(
        "2 processes on GPU 0, time-sliced, per barrier: "
        + ", ".join(cells(run_pair(args.iters, args.timeout), args.iters)),
        flush=True,
    )
    if not args.no_mps:
        print(with_mps(args.iters, args.timeout), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
