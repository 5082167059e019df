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


def in_both_orders(comm, codec, kernels=True):
    """The sequence with async compressed calls, then blocking; the lane's thread name
    while it ran (None once empty). ``kernels``: False runs the codecs' numpy methods,
    so that the calls take the Python path (the lane), not the engine's collective."""
    from ringreduce.compression.codecs import use_kernels

    old = use_kernels()
    use_kernels(kernels)
    try:
        lanes = []
        got = sequence(comm, codec, True)
        lanes.append(
            sorted(t.name for t in threading.enumerate() if t.name.startswith("ringreduce-"))
        )
        return {"async": got, "blocking": sequence(comm, codec, False), "lanes": lanes}
    finally:
        use_kernels(old)


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


def same_thread_whatever_the_lane(comm, codec):
    """Rank 0 issues each next call while its lane still runs the one before; rank 1
    only once its lane is empty (it waits, then sleeps). Each call must still be issued
    from the same thread on both ranks (else the engine refuses it as concurrent use):
    a blocking compressed call from the caller, an async one (a small "auto" one too,
    which auto keeps exact) from the lane."""
    import time

    x = contribution(comm.rank, 20_000, "float32")
    small = contribution(comm.rank, 100, "float32")
    out = {}
    first = comm.all_reduce(x, compression=codec, async_op=True)
    if comm.rank == 1:
        first.wait()
        time.sleep(0.5)
    out["blocking"] = comm.all_reduce(x, compression=codec)
    out["first"] = first.wait()
    big = comm.all_reduce(x, compression="auto", async_op=True)
    if comm.rank == 1:
        big.wait()
        time.sleep(0.5)
    tiny = comm.all_reduce(small, compression="auto", async_op=True)
    out["big"], out["tiny"] = big.wait(), tiny.wait()
    out["after"] = comm.all_reduce(np.ones(4, np.float32))
    return out
