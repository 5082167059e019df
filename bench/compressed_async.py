"""What an async compressed call costs the caller: how long it takes to return, how long
an exact async call issued right after it takes to return, and whether the compressed
call overlaps the caller's own work (a sleep of the call's length).

    ringreduce launch -n 2 --transport tcp -- python bench/compressed_async.py

Each line is one round (after a warm-up), on rank 0: the int8 all_reduce of 32 MB
(``--mib``) issued with async_op=True, then an exact async all_reduce of 256 KB in
place; "both done" is from the first issue to the second wait. "overlap" then times
the compressed call alone, and the same call with a ``time.sleep`` of that length
between issue and wait: 1.0x means the sleep hid the call entirely.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import ringreduce as rr


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--codec", default="int8")
    p.add_argument("--mib", type=int, default=32, help="the compressed call's size")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    comm = rr.init()
    x = np.random.default_rng(comm.rank).standard_normal(args.mib << 18).astype(np.float32)
    y = np.ones(64 << 10, np.float32)
    comm.all_reduce(x, compression=args.codec)  # warm: scratch, links, auto's tables
    for _ in range(args.rounds):
        comm.barrier()
        t0 = time.perf_counter()
        compressed = comm.all_reduce(x, compression=args.codec, async_op=True)
        t1 = time.perf_counter()
        exact = comm.all_reduce(y, out=y, async_op=True)
        t2 = time.perf_counter()
        compressed.wait()
        exact.wait()
        t3 = time.perf_counter()
        if comm.rank == 0:
            print(
                f"{args.codec} {args.mib} MiB async returns {(t1 - t0) * 1e3:6.2f} ms; exact "
                f"256 KB async after it returns {(t2 - t1) * 1e3:6.2f} ms; both done "
                f"{(t3 - t0) * 1e3:6.1f} ms",
                flush=True,
            )
    for _ in range(args.rounds):
        comm.barrier()
        t0 = time.perf_counter()
        comm.all_reduce(x, compression=args.codec, async_op=True).wait()
        alone = time.perf_counter() - t0
        comm.barrier()
        t0 = time.perf_counter()
        work = comm.all_reduce(x, compression=args.codec, async_op=True)
        time.sleep(alone)
        work.wait()
        beside = time.perf_counter() - t0
        if comm.rank == 0:
            print(
                f"overlap: alone {alone * 1e3:6.1f} ms; with a sleep of that length "
                f"{beside * 1e3:6.1f} ms ({beside / alone:.2f}x)",
                flush=True,
            )
    comm.close()


if __name__ == "__main__":
    main()
