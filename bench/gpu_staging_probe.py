"""How fast host memory of each kind feeds and drains the GPU: the numbers a design of
the staged all_reduce needs.

    python bench/gpu_staging_probe.py [--mb 256] [--chunks 128K,1M,16M]

The staged path (executor/device_executor.h) copies every byte off the device into
pinned memory of its own, copies it on the host into the shared-memory transport's
slots, and the receiver copies it out of them again before the copy onto its device.
Copying straight from and into the transport's memory would leave out the host copies,
but that memory is a shared mapping (a memfd), which the GPU reaches at the pinned rate
only once it is page-locked (cudaHostRegister). This probe times, for each chunk size,
--mb MiB moved as back-to-back chunk copies queued on one stream and synchronized once:

  pinned      cudaHostAlloc'd memory (torch pin_memory), what the staging uses now;
  registered  a memfd mapped shared and page-locked with cudaHostRegister, as the
              transport's slots would be;
  pageable    the same mapping unlocked (the driver stages it through its own buffer);
  memcpy      one core copying host to host, the copies the staged path makes now;

in one process, then in two processes at once on the same GPU (as 2 ranks sharing one
GPU do; their sum). GB/s = 1e9 bytes per second. Needs torch with CUDA and a GPU (exit
status 2 without).
"""

from __future__ import annotations

import argparse
import mmap
import multiprocessing as mp
import os
import sys
import time
from typing import Any, Dict, List

KINDS = ("pinned", "registered", "pageable")


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def _shared_mapping(nbytes: int) -> mmap.mmap:
    fd = os.memfd_create("ringreduce-staging-probe")
    try:
        os.ftruncate(fd, nbytes)
        return mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)


def _timed(fn, nbytes: int, synchronize) -> float:
    """GB/s of fn() moving nbytes, best of 3 after one warm-up."""
    fn()
    synchronize()
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        fn()
        synchronize()
        best = min(best, time.perf_counter() - t)
    return nbytes / best / 1e9


def _probe(queue: Any, start: Any, total: int, chunks: List[int]) -> None:
    import numpy as np
    import torch

    torch.cuda.set_device(0)
    cudart = torch.cuda.cudart()
    dev = torch.empty(total, dtype=torch.uint8, device="cuda")
    mapping = _shared_mapping(total)
    shared = torch.frombuffer(mapping, dtype=torch.uint8)
    shared.fill_(1)  # fault every page in before timing
    hosts = {"pinned": torch.empty(total, dtype=torch.uint8).pin_memory(), "pageable": shared}
    result: Dict[str, float] = {}

    def copies(host, chunk: int, to_device: bool):
        def run() -> None:
            for at in range(0, total, chunk):
                d, h = dev[at : at + chunk], host[at : at + chunk]
                (d.copy_(h, non_blocking=True) if to_device else h.copy_(d, non_blocking=True))

        return run

    a = np.ones(total, np.uint8)
    b = np.empty(total, np.uint8)

    def memcpy(chunk: int):
        def run() -> None:
            for at in range(0, total, chunk):
                np.copyto(b[at : at + chunk], a[at : at + chunk])

        return run

    def measure(kind: str, host) -> None:
        for chunk in chunks:
            start.wait()  # every process times the same copies at once
            result[f"{kind} {chunk} to device"] = _timed(
                copies(host, chunk, True), total, torch.cuda.synchronize
            )
            start.wait()
            result[f"{kind} {chunk} to host"] = _timed(
                copies(host, chunk, False), total, torch.cuda.synchronize
            )

    measure("pinned", hosts["pinned"])
    measure("pageable", hosts["pageable"])
    address = shared.data_ptr()
    err = cudart.cudaHostRegister(address, total, 0)
    if int(err) != 0:
        raise RuntimeError(f"cudaHostRegister of a shared mapping failed: error {int(err)}")
    try:
        measure("registered", shared)
    finally:
        cudart.cudaHostUnregister(address)
    for chunk in chunks:
        start.wait()
        result[f"memcpy {chunk}"] = _timed(memcpy(chunk), total, lambda: None)
    del shared
    queue.put(result)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=256, help="MiB moved per timing (default 256)")
    parser.add_argument("--chunks", default="128K,1M,16M", help="chunk sizes (default 128K,1M,16M)")
    args = parser.parse_args()
    chunks = [parse_size(c) for c in args.chunks.split(",")]
    total = args.mb << 20
    import torch

    if not torch.cuda.is_available():
        print("gpu_staging_probe: needs torch with CUDA and a GPU", file=sys.stderr)
        return 2
    ctx = mp.get_context("spawn")
    print(f"GB/s moving {args.mb} MiB as back-to-back chunk copies, one synchronize")
    print(
        f"{'procs':>5} {'chunk':>9} "
        + " ".join(f"{k + ' h2d':>15} {k + ' d2h':>15}" for k in KINDS)
        + f" {'memcpy':>8}"
    )
    for procs in (1, 2):
        queue, start = ctx.Queue(), ctx.Barrier(procs)
        workers = [
            ctx.Process(target=_probe, args=(queue, start, total, chunks)) for _ in range(procs)
        ]
        for w in workers:
            w.start()
        results = [queue.get(timeout=300) for _ in workers]
        for w in workers:
            w.join()
        for chunk in chunks:
            # Two processes: the sum of their rates (each timed over the same window).
            cells = []
            for kind in KINDS:
                for way in ("to device", "to host"):
                    cells.append(f"{sum(r[f'{kind} {chunk} {way}'] for r in results):>15.1f}")
            memcpy = sum(r[f"memcpy {chunk}"] for r in results)
            print(f"{procs:>5} {chunk:>9} " + " ".join(cells) + f" {memcpy:>8.1f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
