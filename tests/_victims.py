"""What the rank scripts of the fault-tolerance tests share (tests/_shrink_rank.py,
tests/_grow_rank.py): the check of a communicator after a shrink or a grow, and an
all_reduce loop in which one rank fails itself."""

from __future__ import annotations

import os
import signal
import time
from typing import Optional

import numpy as np

import ringreduce as rr


def check(comm) -> bool:
    got = comm.all_reduce(np.full(1000, comm.rank + 1.0))
    return bool(np.all(got == comm.world_size * (comm.world_size + 1) / 2))


def check_sizes(comm, sizes=(1, 1000, 1 << 18, 1 << 22)) -> bool:
    """all_reduce of every size (float32, a different random vector on each rank) against
    numpy's sum of all of them: a link taken over with a stray byte would show here."""
    ok = True
    for n in sizes:
        mine = np.random.default_rng([n, comm.rank]).random(n, dtype=np.float32)
        every = [
            np.random.default_rng([n, r]).random(n, dtype=np.float32)
            for r in range(comm.world_size)
        ]
        want = np.sum(every, axis=0, dtype=np.float64)
        ok = ok and bool(np.allclose(comm.all_reduce(mine), want, rtol=1e-5, atol=1e-5))
    return ok


def fail_in_loop(
    comm,
    rank: int,
    victim: int,
    sig: int = signal.SIGKILL,
    after: float = 0.3,
    elems: int = 1 << 15,
) -> Optional[rr.RingReduceError]:
    """all_reduce until a call fails, and return its error (None after 60 s without one);
    rank ``victim`` sends itself ``sig`` once ``after`` seconds have passed."""
    x = np.ones(elems, dtype=np.float32)
    start = time.monotonic()
    while time.monotonic() - start < 60:
        if rank == victim and time.monotonic() - start > after:
            os.kill(os.getpid(), sig)
        try:
            comm.all_reduce(x, out=x)
        except rr.RingReduceError as exc:
            return exc
        x[:] = 1
    return None
