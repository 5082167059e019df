"""One rank of a GradientBucketer(fault_tolerant=True) job (tests/test_bucketing_ft.py):

    python _ft_bucket_rank.py RANK SIZE PORT TRANSPORT VICTIM STEPS DTYPE

Each step every rank hands over gradients that depend on (rank, step), last layer first;
in step 1 the victim dies after handing over the first bucket's gradients, so the others'
first bucket is reduced with it and their second is not. Prints one JSON line: every
step's reduced gradients and the world size after it.
"""

from __future__ import annotations

import json
import os
import signal
import sys

SHAPES = [(300,), (40, 5), (1000,), (7,)]  # registered first layer first


def grads(rank: int, step: int, dtype) -> list:
    return [np.full(s, 1.0 + rank + 10 * step + i, dtype=dtype) for i, s in enumerate(SHAPES)]


def main() -> None:
    rank, size, port, transport, victim, steps, dtype = sys.argv[1:8]
    rank, size, victim, steps = int(rank), int(size), int(victim), int(steps)
    comm = rr.init(transport, rank=rank, world_size=size, master_addr="127.0.0.1",
                   master_port=int(port), timeout=20)  # fmt: skip
    changes = []
    b = rr.GradientBucketer(  # caps of ~100 bytes: one bucket per parameter
        comm, bucket_mb=1e-4, first_bucket_mb=1e-4, fault_tolerant=True,
        on_membership_change=lambda c: changes.append(c.world_size),
    )  # fmt: skip
    handles = [b.register(f"p{i}", s, dtype) for i, s in enumerate(SHAPES)]
    out = []
    for step in range(steps):
        g = grads(rank, step, dtype)
        for i in reversed(range(len(SHAPES))):
            b.ready(handles[i], g[i])
            if rank == victim and step == 1 and i == len(SHAPES) - 1:
                b._buckets[0].work.wait()  # the first bucket is reduced with this rank
                os.kill(os.getpid(), signal.SIGKILL)
        b.wait()
        out.append({"world": b.world_size, "grads": [x.astype(float).tolist() for x in g]})
    print(json.dumps({"rank": rank, "steps": out, "changes": changes, "plan": b.plan}), flush=True)
    b.comm.close()


if __name__ == "__main__":
    import numpy as np

    import ringreduce as rr

    main()
