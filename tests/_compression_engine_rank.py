"""Rank side of tests/test_compression_engine.py (module level, so they pickle by
reference)."""

from __future__ import annotations

import numpy as np
from _compression_rank import contribution

from ringreduce.compression import configure, settings
from ringreduce.compression.codecs import use_kernels


def one_collective(comm, n):
    """An int8 all_reduce and reduce_scatter of n values (the canary off): the engine
    collectives each took, the bytes sent against what the codec's stats say, and the
    engine's counters for int8."""
    old = settings().canary_every
    configure(canary_every=0)
    try:
        x = contribution(comm.rank, n, "float32")
        got = {}
        for what in ("all_reduce", "reduce_scatter"):
            before = comm.stats()
            getattr(comm, what)(x, compression="int8")
            after = comm.stats()
            got[what] = (
                after["ops"] - before["ops"],
                after["bytes_sent"] - before["bytes_sent"],
                after["wire_bytes"]["int8"] - before["wire_bytes"].get("int8", 0),
            )
        return got, comm.stats()["engine_codecs"]["int8"]
    finally:
        configure(canary_every=old)


def codecs_differ(comm, mine):
    """Each rank calls with its own codec (``mine[rank]``, None: exact); the error's
    kind and text."""
    x = np.ones(1000, np.float32)
    try:
        comm.all_reduce(x, compression=mine[comm.rank])
    except Exception as exc:  # noqa: BLE001 - the test looks at what it is
        return type(exc).__name__, str(exc)
    return "none", ""


def nothing_waits(comm):
    """Rank 0 issues an async int8 all_reduce of 4 MB, then an async exact one and an
    async bf16 reduce_scatter, and only then lets rank 1 issue anything: every call
    returned unfinished, so none waited for another. Results, in issue order."""
    big = contribution(comm.rank, 1 << 20, "float32")
    small = contribution(comm.rank, 1000, "float32")
    if comm.rank == 0:
        works = [
            comm.all_reduce(big, compression="int8", async_op=True),
            comm.all_reduce(small, async_op=True),
            comm.reduce_scatter(small, compression="bf16", async_op=True),
        ]
        pending = [not w.done() for w in works]
        comm.send(np.ones(1, np.float32), 1)
    else:
        comm.recv(np.empty(1, np.float32), 0)
        pending = None
        works = [
            comm.all_reduce(big, compression="int8", async_op=True),
            comm.all_reduce(small, async_op=True),
            comm.reduce_scatter(small, compression="bf16", async_op=True),
        ]
    return pending, [w.wait() for w in works]


def engine_and_python_paths(comm, codec, dtype, op, scatter, feedback):
    """One call on the engine's collective and the same on the Python path (the codecs'
    numpy methods), each on its own fresh call number: (engine, python, residuals)."""
    from ringreduce._comm.compressed.route import _state

    x = contribution(comm.rank, 3001, dtype)
    out = []
    residuals = []
    for kernels in (True, False):
        st = _state(comm)
        st.calls = 7  # the same seeds for both paths
        old = use_kernels()
        use_kernels(kernels)
        try:
            residual = np.zeros(x.size, np.float32) if feedback else None
            if residual is not None:
                residual[::7] = 0.25  # something owed from earlier calls
            call = comm.reduce_scatter if scatter else comm.all_reduce
            out.append(call(x, op, compression=codec, error_feedback=residual))
            residuals.append(residual)
        finally:
            use_kernels(old)
    return out, residuals


def exact_with_residual(comm):
    """An "auto" call too small to compress, with a residual owed (error feedback):
    queued on the engine as an exact one-hop call with float32 rows, the residual sent
    along and cleared. (Work's class, whether the lane ever started, the result, the
    exact sum of x + residual, the residual after.)"""
    import threading

    x = contribution(comm.rank, 1000, "float32")
    residual = np.full(x.size, 0.125, np.float32)
    want = comm.all_reduce(x + residual)
    work = comm.all_reduce(x, compression="auto", error_feedback=residual, async_op=True)
    got = work.wait()
    lane = any(t.name == "ringreduce-lane" for t in threading.enumerate())
    return type(work).__name__, lane, got, want, residual.copy()
