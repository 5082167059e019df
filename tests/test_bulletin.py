"""The shared-memory bulletin (transport/bulletin.h): call headers, and tiny all_reduce
data, published in each rank's segment instead of sent as messages.

Its risks are its own: an entry replaced before a reader read it (flow control), a
rank on the bulletin facing a rank on the message path (a mismatch that must not
hang), and waits on it that must blame like any other wait.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

import ringreduce as rr

from _ranks import run_ranks

# The largest all_reduce the bulletin carries: 120-byte entries less a 40-byte header.
LIMIT = 80


def _exact(comm):
    """Tiny all_reduce of every dtype and op, at and around the bulletin's limit,
    against numpy: small integers, so every sum is exact."""
    n, r = comm.world_size, comm.rank
    bad = []
    for dtype in ["float16", "float32", "float64", "int8", "uint8", "int32", "int64"]:
        size = np.dtype(dtype).itemsize
        for count in sorted({1, 2, LIMIT // size - 1, LIMIT // size, LIMIT // size + 1}):
            parts = [(np.arange(count) % 3 + k + 1).astype(dtype) for k in range(n)]
            ops = {"sum": np.sum, "max": np.max, "min": np.min}
            if np.dtype(dtype).kind == "f":
                ops["avg"] = np.mean
            for op, ref in ops.items():
                got = comm.all_reduce(parts[r], op)
                want = ref(np.stack(parts).astype(np.float64), axis=0)
                if not np.array_equal(got.astype(np.float64), want):
                    bad.append((dtype, count, op, got.tolist(), want.tolist()))
    stats = comm.stats()["all_reduce_algorithms"]
    return bad, stats


@pytest.mark.parametrize("n", [2, 3, 4])
def test_tiny_all_reduce_is_exact(group_factory, n):
    for bad, stats in group_factory(n, transport="shm").run(_exact):
        assert bad == []
        assert stats["direct"] > 0, stats


def _mixed(comm, seed, rounds):
    """The same random sequence of calls on every rank, each result checked: tiny and
    larger all_reduces, broadcasts from every root (the root only sends, so it may run
    ahead: the bulletin must hold it back until its entries are read), reduce_scatter,
    barrier."""
    rng = np.random.default_rng(seed)
    n, r = comm.world_size, comm.rank
    for i in range(rounds):
        kind = rng.integers(0, 5)
        if kind == 0:
            count = int(rng.integers(1, LIMIT // 4 + 1))
            got = comm.all_reduce(np.full(count, r + i, np.float32))
            expect = sum(k + i for k in range(n))
            if not np.all(got == expect):
                return f"round {i}: tiny all_reduce gave {got[:4]}, expected {expect}"
        elif kind == 1:
            count = int(rng.integers(LIMIT // 4 + 1, 5000))
            got = comm.all_reduce(np.full(count, r + 1, np.int64))
            if not np.all(got == n * (n + 1) // 2):
                return f"round {i}: all_reduce gave {got[:4]}"
        elif kind == 2:
            root = int(rng.integers(0, n))
            x = np.full(int(rng.integers(1, 300)), i if r == root else -1, np.int32)
            comm.broadcast(x, root=root)
            if not np.all(x == i):
                return f"round {i}: broadcast from {root} gave {x[:4]}"
        elif kind == 3:
            got = comm.reduce_scatter(np.full(n * 3, r + 1, np.int32))
            if not np.all(got == n * (n + 1) // 2):
                return f"round {i}: reduce_scatter gave {got}"
        else:
            comm.barrier()
    return "ok"


@pytest.mark.parametrize("n", [2, 3])
def test_mixed_calls_keep_every_entry_until_read(group_factory, n):
    assert group_factory(n, transport="shm").run(_mixed, 7, 600) == ["ok"] * n


def _tiny_against_large(comm):
    """Rank 0 makes a tiny all_reduce (on the bulletin), the others a large one (on
    messages): every rank must raise MismatchError, and soon."""
    start = time.monotonic()
    count = 2 if comm.rank == 0 else 1000
    try:
        comm.all_reduce(np.ones(count, np.float32))
        return "no error", time.monotonic() - start
    except rr.RingReduceError as exc:
        return (type(exc).__name__, str(exc)), time.monotonic() - start


@pytest.mark.parametrize("n", [2, 3])
def test_a_tiny_call_meeting_a_large_one_is_a_mismatch(n):
    outcomes = run_ranks(n, _tiny_against_large, init_timeout=60, transport="shm")
    for rank, (status, value, tb) in enumerate(outcomes):
        assert status == "ok", tb
        (kind, message), seconds = value
        assert kind == "MismatchError", (rank, message)
        assert "all_reduce(count=2, float32, sum)" in message, (rank, message)
        assert "all_reduce(count=1000, float32, sum)" in message, (rank, message)
        assert seconds < 30, f"rank {rank} took {seconds:.1f} s: the timeout, not the check"


def _tiny_loop_until_error(comm, victim):
    if comm.rank == victim:
        time.sleep(0.5)
        os.kill(os.getpid(), 9)
    start = time.monotonic()
    x = np.ones(2, np.float32)
    while time.monotonic() - start < 30:
        try:
            comm.all_reduce(x)
        except rr.RingReduceError as exc:
            return type(exc).__name__, exc.peer, str(exc)
    return "no error"


def test_a_rank_killed_between_tiny_calls_is_named_on_every_survivor():
    from _ranks import survivors

    victim = 1
    for kind, peer, message in survivors(3, _tiny_loop_until_error, victim).values():
        assert (kind, peer) == ("PeerError", victim), message
