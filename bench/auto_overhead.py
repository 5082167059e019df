"""The per-call cost of compression="auto" where auto keeps every call exact (one host
over shared memory, or a world of one), against compression=None on the same array.

    ringreduce launch -n 2 --transport shm -- python bench/auto_overhead.py

Each line: the best of 7 timed loops per path (2000 calls; 300 at 1 MiB, 20 at 16 MiB, 5
at 64 MiB), the paths' loops alternating so that both see the same load; float32 sum,
out of place.
"""

import time

import numpy as np

import ringreduce as rr


def main() -> None:
    comm = rr.init()
    for n, iters in ((2, 2000), (16384, 2000), (1 << 18, 300), (1 << 22, 20), (1 << 24, 5)):
        x = np.ones(n, np.float32)
        best = {}
        for rnd in range(7):
            for c in (None, "auto") if rnd % 2 else ("auto", None):
                for _ in range(min(iters, 20)):
                    comm.all_reduce(x, compression=c)
                comm.barrier()
                t0 = time.perf_counter()
                for _ in range(iters):
                    comm.all_reduce(x, compression=c)
                best[c] = min(best.get(c, 1.0), (time.perf_counter() - t0) / iters)
        if comm.rank == 0:
            exact, auto = best[None] * 1e6, best["auto"] * 1e6
            print(
                f"world {comm.world_size} {comm.transport:4s} {n * 4:>9} B  exact {exact:7.2f} us"
                f"  auto {auto:7.2f} us  auto-exact {auto - exact:+.2f} us ({auto / exact:.3f}x)"
            )
    comm.close()


if __name__ == "__main__":
    main()
