"""What one GPU round trip costs: a pinned copy to or from the device, then a synchronize.

    python bench/gpu_sync_probe.py [--iters 300]

The floor under any all_reduce of CUDA arrays that stages through the host: each
copy that the host must see finished costs at least this, whatever its size. Timed
in one process, then in two processes doing the same on the same GPU at once (as
bench/gpu_transports.py's ranks share one GPU), to show what sharing the GPU adds.
Medians in microseconds; the two-process figure is the slower process's. Needs
torch with CUDA and a GPU (exit status 2 without).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import time
from typing import Any, Dict

SIZES = (8, 64 << 10, 1 << 20)


def _probe(queue: Any, start: Any, iters: int) -> None:
    import torch

    torch.cuda.set_device(0)
    result: Dict[str, float] = {}
    for nbytes in SIZES:
        dev = torch.empty(max(nbytes // 4, 2), device="cuda")
        host = torch.empty(dev.shape).pin_memory()
        torch.cuda.synchronize()
        start.wait()  # every process times the same size at once
        copies = {
            "to host": lambda h=host, d=dev: h.copy_(d, non_blocking=True),
            "to device": lambda h=host, d=dev: d.copy_(h, non_blocking=True),
        }
        for name, copy in copies.items():
            times = []
            for _ in range(iters):
                t = time.perf_counter()
                copy()
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t)
            result[f"{name} {nbytes} B"] = statistics.median(times) * 1e6
    queue.put(result)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=300)
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("gpu_sync_probe: needs torch with CUDA and a GPU", file=sys.stderr)
        return 2
    ctx = mp.get_context("spawn")
    for procs in (1, 2):
        queue, start = ctx.Queue(), ctx.Barrier(procs)
        workers = [
            ctx.Process(target=_probe, args=(queue, start, args.iters)) for _ in range(procs)
        ]
        for w in workers:
            w.start()
        results = [queue.get(timeout=120) for _ in workers]
        for w in workers:
            w.join()
        cells = ", ".join(f"{k} {max(r[k] for r in results):.1f}" for k in results[0])
        print(f"{procs} process(es), median us per copy + synchronize: {cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
