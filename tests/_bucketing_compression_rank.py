"""One rank of a GradientBucketer(fault_tolerant=True, compression="int8",
error_feedback=True) job (tests/test_bucketing_compression.py):

    python _bucketing_compression_rank.py RANK SIZE PORT VICTIM

Two steps with gradients that depend on (rank, step); in step 1 the victim dies after the
first bucket was reduced with it. Prints one JSON line: every step's reduced gradients,
the world size after it and the residuals' norm by name.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import numpy as np

SHAPES = [(300,), (40, 5), (1000,)]  # registered first layer first: one bucket each


def grads(rank: int, step: int):
    rng = np.random.default_rng([rank, step])
    return [rng.standard_normal(s).astype(np.float32) for s in SHAPES]


def main() -> None:
    rank, size, port, victim = (int(a) for a in sys.argv[1:5])
    comm = rr.init(
        "tcp", rank=rank, world_size=size, master_addr="127.0.0.1", master_port=port, timeout=20
    )
    b = rr.GradientBucketer(
        comm,
        bucket_mb=1e-4,
        first_bucket_mb=1e-4,
        fault_tolerant=True,
        compression="int8",
        error_feedback=True,
    )
    handles = [b.register(f"p{i}", s, "float32") for i, s in enumerate(SHAPES)]
    out = []
    for step in range(2):
        g = grads(rank, step)
        for i in reversed(range(len(SHAPES))):
            b.ready(handles[i], g[i])
            if rank == victim and step == 1 and i == len(SHAPES) - 1:
                os.kill(os.getpid(), signal.SIGKILL)  # bucket 0 was reduced with this rank
        b.wait()
        ef = b.error_feedback
        out.append(
            {
                "world": b.world_size,
                "grads": [x.tolist() for x in g],
                "residual_norm": {k: ef.key(k).norm() for k in ef.keys()},
            }
        )
    print(json.dumps({"rank": rank, "steps": out}), flush=True)
    b.comm.close()


if __name__ == "__main__":
    import ringreduce as rr

    main()
