"""all_reduce over windows (comm.empty): each rank reduces its chunk straight out of its
peers' arrays and copies the others' results out of theirs.

Its risks are its own: a rank reading a peer's block before it is reduced, or writing
its output while a peer still reads it (the phases); ranks that disagree on the path
(a mismatch, never a hang); a peer's window gone on this side; and the one choice in
the engine made from where the buffers live.
"""

from __future__ import annotations

import os
import tempfile
import time

import numpy as np
import pytest
from _kernels import half_window_cases

import ringreduce as rr

from _data import DTYPES, FLOATING, OPS, contribution, expected, np_dtype, same_bits
from _ranks import native_stderr, run_ranks, survivors

BLOCK_BYTES = 64 << 10  # window_all_reduce.cc's blocks


MIN_BYTES_PER_RANK = 4096  # window_all_reduce.h: smaller calls take the direct path


def _counts(n, itemsize):
    """Just past the path's smallest size, not divisible by n, around a block's edge,
    and several blocks per chunk."""
    block = BLOCK_BYTES // itemsize
    least = MIN_BYTES_PER_RANK * n // itemsize + 1
    return sorted({least, least + 97 * n, n * block - 1, n * block + n + 1, 3 * n * block + 5})


def _exact(comm):
    n, r = comm.world_size, comm.rank
    biggest = max(_counts(n, 1))
    x = comm.empty(biggest * 8, np.uint8)
    y = comm.empty(biggest * 8, np.uint8)
    bad, calls = [], 0
    before = comm.stats()["all_reduce_algorithms"]["window"]
    for dtype in DTYPES:
        dt = np_dtype(dtype)
        xs, ys = x.view(dt), y.view(dt)
        for count in _counts(n, dt.itemsize):
            for op in OPS:
                if op == "avg" and dtype not in FLOATING:
                    continue
                want = expected(n, count, dtype, op)
                for in_place in (False, True):
                    xs[:count] = contribution(r, count, dtype, op)
                    out = xs[:count] if in_place else ys[:count]
                    got = comm.all_reduce(xs[:count], op, out=out)
                    calls += 1
                    if got is not out and not np.shares_memory(got, out):
                        bad.append((dtype, count, op, in_place, "result is not out"))
                    elif not same_bits(out, want):
                        wrong = (
                            int(np.flatnonzero(out != want)[0]) if out.shape == want.shape else -1
                        )
                        bad.append((dtype, count, op, in_place, wrong))
    ran = comm.stats()["all_reduce_algorithms"]["window"] - before
    return bad, calls, ran


@pytest.mark.parametrize("n", [2, 3, 4])
def test_every_dtype_and_op_matches_numpy_bit_for_bit(group_factory, n):
    for bad, calls, ran in group_factory(n, transport="shm").run(_exact):
        assert bad == []
        assert ran == calls > 0


def _float_order(comm):
    """Random float32: the sum is in rank order, so it has the bits of numpy's
    ((x0 + x1) + x2) + ..., the same on every rank."""
    n, r = comm.world_size, comm.rank
    count = 3 * (BLOCK_BYTES // 4) * n + 11
    x = comm.empty(count, np.float32)
    parts = [np.random.default_rng(k).standard_normal(count).astype(np.float32) for k in range(n)]
    x[:] = parts[r]
    out = comm.empty(count, np.float32)
    comm.all_reduce(x, out=out)
    want = parts[0].copy()
    for p in parts[1:]:
        want = want + p
    return same_bits(out, want), out.tobytes() == comm.all_gather(out).reshape(n, -1)[0].tobytes()


@pytest.mark.parametrize("n", [2, 3])
def test_float_sums_have_rank_order_bits_on_every_rank(group_factory, n):
    for matches, same_as_rank0 in group_factory(n, transport="shm").run(_float_order):
        assert matches and same_as_rank0


def _half_sums(comm):
    """Random float16 and bfloat16 gradients over several blocks per chunk, summed and
    averaged in place and out of place: what went wrong against float32 accumulation
    rounded once, whether every rank has the same bits, and whether the data could tell
    that from rounding at every hop."""
    n = comm.world_size
    count = 3 * n * (BLOCK_BYTES // 2) + 11
    bad, same, telling = [], True, []
    before = comm.stats()["all_reduce_algorithms"]["window"]
    for dtype, op, inputs, want, differs in half_window_cases(n, count):
        telling.append(differs)
        x = comm.empty(count, np_dtype(dtype))
        out = comm.empty(count, np_dtype(dtype))
        for in_place in (False, True):
            x[:] = inputs[comm.rank]
            got = comm.all_reduce(x, op=op, out=x if in_place else out)
            if not same_bits(got, want):
                bad.append((dtype, op, in_place, int(np.flatnonzero(got != want)[0])))
            same = same and got.tobytes() == comm.all_gather(got).reshape(n, -1)[0].tobytes()
    return bad, same, telling, comm.stats()["all_reduce_algorithms"]["window"] - before


@pytest.mark.parametrize("n", [2, 3, 4])
def test_16_bit_floats_accumulate_in_float32_and_round_once(group_factory, n):
    """Each rank reduces its chunk out of every rank's window at once, so float16 and
    bfloat16 sums and averages are float32's in rank order, rounded once (not at every
    addition as a ring's hops must): the same bits on every rank. From 3 ranks the data
    make that differ from rounding at every hop."""
    for bad, same, telling, windows in group_factory(n, transport="shm").run(_half_sums):
        assert bad == [] and same
        assert windows == 8
        if n >= 3:
            assert all(telling)


def _reuse_under_pressure(comm, rounds):
    """Back-to-back calls that rewrite their buffers at once: a rank that returned before
    its peers finished reading its output, or that read a block before its owner reduced
    it, gives a wrong sum in some round."""
    n, r = comm.world_size, comm.rank
    count = 2 * (BLOCK_BYTES // 8) * n + 3
    x = comm.empty(count, np.int64)
    y = comm.empty(count, np.int64)
    base = np.arange(count, dtype=np.int64)
    for i in range(rounds):
        x[:] = base * (r + 1) + i
        y[:] = -1  # overwritten right after the previous call returned
        comm.all_reduce(x, out=y)
        want = base * (n * (n + 1) // 2) + n * i
        if not np.array_equal(y, want):
            return f"round {i}: {int(np.count_nonzero(y != want))} elements wrong"
        if i % 3 == 0:
            comm.all_reduce(x, out=x)  # in place too
            if not np.array_equal(x, want):
                return f"round {i} in place: wrong"
    return "ok"


@pytest.mark.parametrize("n", [2, 4])
def test_buffers_rewritten_between_calls_never_corrupt_a_sum(group_factory, n):
    assert group_factory(n, transport="shm").run(_reuse_under_pressure, 150) == ["ok"] * n


def _mixed_with_other_calls(comm):
    """Window calls between ordinary ones (the bulletin's entries and the phase go on
    counting), and ordinary arrays on every rank after windows exist."""
    n, r = comm.world_size, comm.rank
    x = comm.empty(5000, np.float32)
    algorithms = []
    for i in range(20):
        x[:] = r + i
        if i % 2:
            comm.all_reduce(x, out=x)  # the fast path (fast_path.cc)
        else:
            comm.all_reduce(x, out=x, async_op=True).wait()  # the engine's worker
        plain = comm.all_reduce(np.full(5000, r + i, np.float32))
        tiny = comm.all_reduce(np.full(3, r, np.float32), out=x[:3])
        comm.barrier()
        if not (np.all(x[3:] == n * i + n * (n - 1) / 2) and np.all(plain == x[3])):
            return f"round {i}: wrong"
        if not np.all(tiny == n * (n - 1) / 2):
            return f"round {i}: tiny wrong"
    algorithms = comm.stats()["all_reduce_algorithms"]
    return "ok" if algorithms["window"] >= 20 and algorithms["direct"] >= 20 else algorithms


def test_window_calls_interleave_with_every_other_kind(group_factory):
    assert group_factory(3, transport="shm").run(_mixed_with_other_calls) == ["ok"] * 3


def _plain_where_no_shared_memory(comm):
    x = comm.empty((3, 4), np.float64)
    x[:] = comm.rank + 1
    comm.all_reduce(x, out=x)
    return x.shape, x.dtype.name, float(x[0, 0]), comm.stats()["all_reduce_algorithms"]["window"]


def test_over_tcp_empty_is_numpy_zeros_and_all_reduce_takes_its_usual_path(group_factory):
    for shape, dtype, value, window in group_factory(2, transport="tcp").run(
        _plain_where_no_shared_memory
    ):
        assert (shape, dtype, value, window) == ((3, 4), "float64", 3.0, 0)


def _one_window_one_plain(comm):
    start = time.monotonic()
    x, out = comm.empty(10000, np.float32), comm.empty(10000, np.float32)
    if comm.rank == 1:
        x, out = np.zeros(10000, np.float32), np.zeros(10000, np.float32)
    try:
        comm.all_reduce(x, out=out)
        return "no error", time.monotonic() - start
    except rr.RingReduceError as exc:
        return (type(exc).__name__, str(exc)), time.monotonic() - start


@pytest.mark.parametrize("n", [2, 3])
def test_a_rank_without_windows_is_a_mismatch_on_every_rank(n):
    for rank, (status, value, tb) in enumerate(
        run_ranks(n, _one_window_one_plain, init_timeout=60, transport="shm", timeout=90)
    ):
        assert status == "ok", tb
        (kind, message), seconds = value
        assert seconds < 15, f"rank {rank} took {seconds:.1f} s: the timeout, not the check"
        if kind == "MismatchError":
            assert "window path" in message, (rank, message)
        else:
            # A rank that saw no header of the others' path learns of the failure from
            # the rank that found it.
            assert kind == "PeerError", (rank, message)


def _peer_window_gone(comm):
    """Rank 1 drops window 1 and uses window 2; rank 0 uses window 1. Rank 1 no longer
    maps rank 0's window 1: it refuses, and rank 0 hears of it at once."""
    import gc

    start = time.monotonic()
    a = comm.empty(4096, np.float32)
    b = comm.empty(4096, np.float32)
    if comm.rank == 1:
        a = b
        gc.collect()
    try:
        comm.all_reduce(a, out=a)
        return "no error", time.monotonic() - start
    except rr.RingReduceError as exc:
        return (type(exc).__name__, str(exc)), time.monotonic() - start


def test_a_window_freed_on_one_rank_is_refused_not_read():
    outcomes = run_ranks(2, _peer_window_gone, init_timeout=60, transport="shm", timeout=90)
    for rank, (status, value, tb) in enumerate(outcomes):
        assert status == "ok", tb
        (kind, message), seconds = value
        assert seconds < 15, f"rank {rank} took {seconds:.1f} s"
    (_, m0), _ = outcomes[0][1]
    (_, m1), _ = outcomes[1][1]
    assert "window 1, which rank 1 no longer holds" in m1, m1
    assert "rank 1" in m0, m0


def test_one_rank_gets_numpy_zeros():
    with rr.init("shm", rank=0, world_size=1, store_dir=tempfile.mkdtemp()) as comm:
        x = comm.empty(7, "int32")
        assert x.dtype == np.int32 and x.shape == (7,) and not x.any()
        with pytest.raises(ValueError, match="shape"):
            comm.empty((2, -1))


def window_loop_until_error(comm, victim, device=None):
    """all_reduce over windows (device windows with ``device``) until one raises; the
    victim kills itself after half a second."""
    x = comm.empty(1 << 16, np.float32, device=device)
    if comm.rank == victim:
        time.sleep(0.5)
        os.kill(os.getpid(), 9)
    start = time.monotonic()
    while time.monotonic() - start < 30:
        try:
            comm.all_reduce(x, out=x)
        except rr.RingReduceError as exc:
            return type(exc).__name__, exc.peer, time.monotonic() - start
    return "no error"


def test_a_rank_killed_between_window_calls_is_named_on_every_survivor():
    """The survivors are mid-call, waiting on its header or its phase: each raises
    PeerError naming it, well before the timeout."""
    victim = 1
    for kind, peer, seconds in survivors(3, window_loop_until_error, victim).values():
        assert (kind, peer) == ("PeerError", victim) and seconds < 15, (kind, peer, seconds)


def _below_the_path(comm):
    """At window_min_bytes and under, window arrays take the direct path (and give the
    same sums); one element more takes the window path."""
    n = comm.world_size
    x = comm.empty(MIN_BYTES_PER_RANK * n // 4 + 1, np.float32)
    y = comm.empty(x.shape, np.float32)
    x[:] = comm.rank + 1
    before = comm.stats()["all_reduce_algorithms"]
    small = comm.all_reduce(x[:-1], out=y[:-1])
    comm.all_reduce(x, out=x)
    after = comm.stats()["all_reduce_algorithms"]
    return (
        bool(np.all(small == n * (n + 1) / 2)) and bool(np.all(x == n * (n + 1) / 2)),
        after["direct"] - before["direct"],
        after["window"] - before["window"],
    )


@pytest.mark.parametrize("n", [2, 4])
def test_calls_up_to_the_paths_smallest_size_take_the_direct_path(group_factory, n):
    for right, direct, window in group_factory(n, transport="shm").run(_below_the_path):
        assert (right, direct, window) == (True, 1, 1)


def _passed_over(comm):
    """Window arrays that do not take the window path, with the algorithm log on: below
    the path's smallest size, and with the output outside any window."""
    n = comm.world_size
    small = comm.empty(MIN_BYTES_PER_RANK * n // 4, np.float32)
    big = comm.empty(1 << 16, np.float32)
    plain = np.zeros(1 << 16, np.float32)
    small[:] = big[:] = comm.rank + 1
    with native_stderr() as said:
        comm.all_reduce(small, out=small)
        comm.all_reduce(big, out=plain)
    right = bool(np.all(small == n * (n + 1) / 2)) and bool(np.all(plain == n * (n + 1) / 2))
    return right, comm.stats()["all_reduce_algorithms"]["window"], said()


def test_the_algorithm_log_says_why_window_arrays_were_passed_over():
    n = 2
    outcomes = run_ranks(n, _passed_over, transport="shm", env={"RINGREDUCE_DEBUG": "algorithm"})
    for status, value, tb in outcomes:
        assert status == "ok", tb
        right, window, said = value
        assert right and window == 0, (right, window)
        floor = MIN_BYTES_PER_RANK * n
        assert (
            f"not the window path: {floor} bytes is at most the window path's floor of {floor} "
            f"bytes at {n} ranks, below which one step of whole vectors is faster; " in said
        ), said
        assert "not the window path: the output is not wholly inside a host window; " in said, said
