"""Rank-side functions of tests/test_compression_lane.py (module level, so they pickle
by reference)."""

from __future__ import annotations

import threading

import numpy as np
from _compression_rank import contribution

SIZES = (1000, 50_000, 3000, 7000)


def _value(w):
    return w.wait() if hasattr(w, "wait") else w


def sequence(comm, codec, asynchronous):
    """Compressed calls (async or blocking) mixed with exact ones issued meanwhile: a
    blocking exact all_reduce (the fast path's kind), a blocking compressed call, an
    async exact one. Returns every result, in issue order."""
    xs = [contribution(comm.rank + i, n, "float32") for i, n in enumerate(SIZES)]
    a = comm.all_reduce(xs[0], compression=codec, async_op=asynchronous)
    b = comm.all_reduce(xs[1], "avg", compression=codec, async_op=asynchronous)
    exact = comm.all_reduce(xs[2])
    c = comm.reduce_scatter(xs[3], compression=codec, async_op=asynchronous)
    blocking = comm.all_reduce(xs[2], compression=codec)
    exact_async = comm.all_reduce(xs[0], async_op=True)
    d = comm.all_reduce(xs[1], compression=codec, async_op=asynchronous)
    return [_value(w) for w in (a, b, exact, c, blocking, exact_async, d)]


def in_both_orders(comm, codec):
    """The sequence with async compressed calls, then blocking; the lane's thread name
    while it ran (None once empty)."""
    lanes = []
    got = sequence(comm, codec, True)
    lanes.append(sorted(t.name for t in threading.enumerate() if t.name.startswith("ringreduce-")))
    return {"async": got, "blocking": sequence(comm, codec, False), "lanes": lanes}


def overlaps(comm, codec):
    """Rank 0 issues an async compressed call and checks that it came back unfinished
    before rank 1 has even issued its own (rank 1 waits for rank 0's message first),
    then computes while the call runs."""
    x = contribution(comm.rank, 100_000, "float32")
    if comm.rank == 0:
        work = comm.all_reduce(x, compression=codec, async_op=True)
        pending = not work.done()
        comm.send(np.ones(1, np.float32), 1)
        y = work.wait()
    else:
        comm.recv(np.empty(1, np.float32), 0)
        pending = None
        y = comm.all_reduce(x, compression=codec, async_op=True).wait()
    return {"pending": pending, "y": y, "after": comm.all_reduce(np.ones(4, np.float32))}


def failure_reaches_wait(comm, codec):
    """Rank 1 exits before the call; rank 0's async compressed call fails, its error
    raised by wait() (a PeerError naming rank 1) and not by the issue."""
    import os

    x = contribution(comm.rank, 10_000, "float32")
    comm.all_reduce(x, compression=codec)
    if comm.rank == 1:
        os._exit(0)
    work = comm.all_reduce(x, compression=codec, async_op=True)
    try:
        work.wait(timeout=60)
    except Exception as exc:  # noqa: BLE001 - the test looks at what it is
        return {"error": type(exc).__name__, "peer": getattr(exc, "peer", None), "msg": str(exc)}
    return {"error": None}
