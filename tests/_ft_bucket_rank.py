"""One rank of a GradientBucketer(fault_tolerant=True) job (tests/test_bucketing_ft.py):

    python _ft_bucket_rank.py RANK SIZE PORT TRANSPORT VICTIM STEPS DTYPE [LAGGARD]

Each step every rank hands over gradients that depend on (rank, step), last layer first;
in step 1 the victim dies after handing over the first bucket's gradients, so the others'
first bucket is reduced with it and their second is not. Prints one JSON line: every
step's reduced gradients and the world size after it.

With LAGGARD, a death ends a step on some survivors and not on others instead: in step 1
every rank's buckets are reduced, but the laggard's last one fails there (as a rank
whose wait a death ended before its last chunk arrived), after the others ended the
step; the victim dies as step 2 begins, so the others fail in step 2.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

SHAPES = [(300,), (40, 5), (1000,), (7,)]  # registered first layer first


def grads(rank: int, step: int, dtype) -> list:
    return [np.full(s, 1.0 + rank + 10 * step + i, dtype=dtype) for i, s in enumerate(SHAPES)]


def main() -> None:
    rank, size, port, transport, victim, steps, dtype = sys.argv[1:8]
    rank, size, victim, steps = int(rank), int(size), int(victim), int(steps)
    laggard = int(sys.argv[8]) if len(sys.argv) > 8 else -1
    comm = rr.init(
        transport,
        rank=rank,
        world_size=size,
        master_addr="127.0.0.1",
        master_port=int(port),
        timeout=20,
    )
    changes = []
    b = rr.GradientBucketer(  # caps of ~100 bytes: one bucket per parameter
        comm,
        bucket_mb=1e-4,
        first_bucket_mb=1e-4,
        fault_tolerant=True,
        on_membership_change=lambda c: changes.append(c.world_size),
    )
    handles = [b.register(f"p{i}", s, dtype) for i, s in enumerate(SHAPES)]
    out = []
    for step in range(steps):
        g = grads(rank, step, dtype)
        if laggard >= 0 and rank == victim and step == 2:
            os.kill(os.getpid(), signal.SIGKILL)  # after it ended step 1, as the others did
        for i in reversed(range(len(SHAPES))):
            b.ready(handles[i], g[i])
            if laggard < 0 and rank == victim and step == 1 and i == len(SHAPES) - 1:
                b._buckets[0].work.wait()  # the first bucket is reduced with this rank
                os.kill(os.getpid(), signal.SIGKILL)
        if rank == laggard and step == 1:
            b._buckets[-1].work = _FailsAfter(b._buckets[-1].work, b.comm)
        b.wait()
        out.append({"world": b.world_size, "grads": [x.astype(float).tolist() for x in g]})
    print(json.dumps({"rank": rank, "steps": out, "changes": changes, "plan": b.plan}), flush=True)
    b.comm.close()


class _FailsAfter:
    """A bucket's Work that completes, then fails on this rank alone: once the others
    have ended the step (they need nothing more from it), the communicator is aborted
    and the wait raises PeerError, as when a death ends a wait before its last chunk."""

    def __init__(self, work, comm):
        self.work, self.comm = work, comm

    def done(self):
        return self.work.done()

    def wait(self):
        self.work.wait()
        time.sleep(1.0)  # the others end the step meanwhile
        self.comm._core.abort()
        raise rr.PeerError("this rank's last all-reduce of the step failed (test)")


if __name__ == "__main__":
    import numpy as np

    import ringreduce as rr

    main()
