"""Collectives on real rank processes, checked against numpy references.

Exact data (small integers) is compared bit for bit; random float data against
a float64 reference with a stated bound.
"""

from __future__ import annotations

import numpy as np
import pytest

import ringreduce as rr

from _data import (
    DTYPES,
    FLOATING,
    all_reduce_exact_failures,
    contribution,
    expected,
    extended,
    links_and_sizes,
    np_dtype,
    over_links,
    same_bits,
    sizes_for,
)

WORLD_SIZES = [1, 2, 3, 4, 5, 8]


# ---- rank-side functions (module level so they pickle by reference) -------


def _all_reduce_exact(comm, dtype):
    return all_reduce_exact_failures(comm, dtype)


def _all_reduce_random(comm, dtype, count, seed):
    n, r = comm.world_size, comm.rank
    parts = [np.random.default_rng(seed + i).standard_normal(count) for i in range(n)]
    x = parts[r].astype(np_dtype(dtype))
    got = comm.all_reduce(x).astype(np.float64)
    inputs = [p.astype(np_dtype(dtype)).astype(np.float64) for p in parts]
    ref = np.sum(inputs, axis=0)
    # Each of the n-1 hops rounds once to the wire dtype: |error| <= (n-1) eps sum|x|.
    eps = float(np.finfo(np.float32).eps) if dtype == "float32" else float(np.finfo(np.float64).eps)
    if dtype == "float16":
        eps = 2.0**-11
    elif dtype == "bfloat16":
        eps = 2.0**-8
    bound = max(n - 1, 1) * eps * np.sum(np.abs(inputs), axis=0) + 1e-300
    return float(np.max(np.abs(got - ref) / bound)) if count else 0.0


def _reduce_scatter(comm, dtype):
    failures = []
    n, r = comm.world_size, comm.rank
    for op in ("sum", "max", "avg"):
        if op == "avg" and dtype not in FLOATING:
            continue
        for count in sizes_for(n):
            want = expected(n, count, dtype, op)
            start, stop = rr.chunk_bounds(count, n, r)
            got = comm.reduce_scatter(contribution(r, count, dtype, op), op=op)
            if not same_bits(got, want[start:stop]):
                failures.append(f"{op} count={count}")
    # Multi-dimensional input reduces the flattened array.
    x = contribution(r, 24, dtype, "sum").reshape(2, 3, 4)
    start, stop = rr.chunk_bounds(24, n, r)
    if not same_bits(comm.reduce_scatter(x), expected(n, 24, dtype, "sum")[start:stop]):
        failures.append("3-d input")
    return failures


def _all_gather(comm, dtype):
    n, r = comm.world_size, comm.rank
    failures = []
    for shape in [(0,), (1,), (5,), (3, 4), (n + 1, 2)]:
        x = (np.arange(int(np.prod(shape))).reshape(shape) % 50 + r).astype(np_dtype(dtype))
        got = comm.all_gather(x)
        want = np.stack(
            [
                (np.arange(int(np.prod(shape))).reshape(shape) % 50 + i).astype(np_dtype(dtype))
                for i in range(n)
            ]
        )
        if not same_bits(got, want):
            failures.append(f"shape {shape}")
        out = np.zeros((n,) + shape, dtype=np_dtype(dtype))
        if comm.all_gather(x, out=out) is not out or not same_bits(out, want):
            failures.append(f"out= shape {shape}")
    return failures


def _broadcast_every_root(comm):
    n, r = comm.world_size, comm.rank
    failures = []
    for root in range(n):
        for count in (0, 1, 13, 300_001):
            x = np.full(count, r, dtype=np.int32) if r != root else np.arange(count, dtype=np.int32)
            res = comm.broadcast(x, root=root)
            if res is not x or not np.array_equal(x, np.arange(count, dtype=np.int32)):
                failures.append(f"root={root} count={count}")
        # A non-contiguous view is filled in place too.
        base = np.full((4, 6), -1.0) if r != root else np.arange(24.0).reshape(4, 6)
        comm.broadcast(base[:, ::2], root=root)
        want = np.arange(24.0).reshape(4, 6)[:, ::2]
        if not np.array_equal(base[:, ::2], want):
            failures.append(f"strided root={root}")
    return failures


def _barrier_and_stats(comm):
    before = comm.stats()["ops"]
    for _ in range(3):
        comm.barrier()
    return comm.stats()["ops"] - before


def _async_in_order(comm):
    n, r = comm.world_size, comm.rank
    xs = [np.full(1000 * (k + 1) + k, r + k, dtype=np.float64) for k in range(6)]
    works = [comm.all_reduce(x, async_op=True) for x in xs[:3]]
    works.append(comm.all_reduce(xs[3], op="max", out=xs[3], async_op=True))
    works.append(comm.all_gather(xs[4][:3], async_op=True))
    works.append(comm.broadcast(xs[5], root=n - 1, async_op=True))
    # Wait in reverse: completing the last implies the earlier ones are done.
    results = [w.wait() for w in reversed(works)][::-1]
    ok = all(w.done() for w in works)
    for k in range(3):
        ok &= bool(np.all(results[k] == sum(i + k for i in range(n))))
    ok &= results[3] is xs[3] and bool(np.all(xs[3] == n - 1 + 3))
    ok &= results[4].shape == (n, 3) and bool(np.all(results[4][:, 0] == np.arange(n) + 4))
    ok &= bool(np.all(xs[5] == n - 1 + 5))
    return ok


def _bytes_on_wire(comm, nbytes):
    x = np.ones(nbytes // 4, dtype=np.float32)
    before = comm.stats()
    comm.all_reduce(x, out=x)
    after = comm.stats()
    return after["bytes_sent"] - before["bytes_sent"], after["bytes_received"] - before[
        "bytes_received"
    ]


def _big_all_reduce(comm, count):
    x = np.full(count, comm.rank + 1, dtype=np.float32)
    comm.all_reduce(x, out=x)
    n = comm.world_size
    return bool(np.all(x == n * (n + 1) / 2))


# ---- tests --------------------------------------------------------------


@pytest.mark.parametrize("links,n,dtype", over_links(DTYPES, WORLD_SIZES))
def test_all_reduce_exact_every_op_and_size(group_factory, links, n, dtype):
    results = group_factory(n, transport=links).run(_all_reduce_exact, dtype)
    assert results == [[]] * n


@pytest.mark.parametrize(
    "links,n,dtype", over_links(["float16", "bfloat16", "float32", "float64"], [2, 3, 5])
)
def test_all_reduce_random_floats_within_bound(group_factory, links, n, dtype):
    ratios = group_factory(n, transport=links).run(_all_reduce_random, dtype, 10_007, 1234)
    assert max(ratios) <= 1.0, f"error / bound = {ratios}"


@pytest.mark.parametrize(
    "links,n,dtype", over_links(["float16", "bfloat16", "float64", "int8", "int64"], WORLD_SIZES)
)
def test_reduce_scatter_blocks_follow_chunk_bounds(group_factory, links, n, dtype):
    assert group_factory(n, transport=links).run(_reduce_scatter, dtype) == [[]] * n


@pytest.mark.parametrize("n", WORLD_SIZES)
@pytest.mark.parametrize("dtype", ["bfloat16", "float32", "uint8"])
def test_all_gather_shape_and_order(group_factory, links, n, dtype):
    assert group_factory(n, transport=links).run(_all_gather, dtype) == [[]] * n


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_broadcast_from_every_root(group_factory, links, n):
    assert group_factory(n, transport=links).run(_broadcast_every_root) == [[]] * n


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_barrier(group_factory, links, n):
    assert group_factory(n, transport=links).run(_barrier_and_stats) == [3] * n


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_async_collectives_complete_in_order(group_factory, links, n):
    assert group_factory(n, transport=links).run(_async_in_order) == [True] * n


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_all_reduce_sends_2_n_minus_1_over_n_bytes(group_factory, links, n):
    nbytes = 4 << 20
    ideal = 2 * (n - 1) / n * nbytes
    for sent, received in group_factory(n, transport=links).run(_bytes_on_wire, nbytes):
        # Chunks differ by at most one element; headers add 40 bytes per call.
        assert ideal - 8 <= sent <= ideal * 1.01
        assert ideal - 8 <= received <= ideal * 1.01


def test_all_reduce_256_megabytes(group_factory, links):
    assert group_factory(2, transport=links).run(_big_all_reduce, 64 << 20, timeout=300) == [
        True,
        True,
    ]


@pytest.mark.parametrize("links,n", links_and_sizes([2, 3, 4], contract=(3,)))
@pytest.mark.parametrize("dtype", ["float16", "int32", "float64"])
def test_tiny_segments_pipeline_correctly(group_factory, links, n, dtype):
    # 40-byte segments: every chunk is cut into many segments, so the
    # double-buffered receive/reduce pipeline runs on odd sizes. The ring is
    # forced at every size (no small-message path).
    group = group_factory(n, segment_bytes=40, small_bytes=0, transport=links)
    assert group.run(_all_reduce_exact, dtype) == [[]] * n
    assert group.run(_reduce_scatter, dtype) == [[]] * n
    assert group.run(_broadcast_every_root) == [[]] * n


def _reduce_then_close_at_once(comm, rounds):
    rng = np.random.default_rng(comm.rank)
    for k in range(rounds):
        x = np.ones(int(1000 + 7919 * k), dtype=np.float32)
        comm.all_reduce(x, out=x)
        assert np.all(x == comm.world_size)
    # Fast ranks close while slow ones still finish their last all-gather
    # step: a neighbour that is done must not look like a dead peer.
    import time

    time.sleep(float(rng.random()) * 0.05)
    comm.close()
    return True


@pytest.mark.parametrize("n", [extended(2), 3, extended(5)])
def test_ranks_may_close_while_neighbours_finish(n, links):
    from _ranks import run_ranks

    for _ in range(3):
        outcomes = run_ranks(n, _reduce_then_close_at_once, 20, transport=links)
        assert [o[1] for o in outcomes] == [True] * n, [o[2] for o in outcomes]


def _gil_released_while_waiting(comm, signal_path):
    """Rank 1 joins the all_reduce only after a Python thread of rank 0 has run while
    rank 0's main thread was blocked in the engine's wait. If that wait held the GIL, the
    thread could not run, rank 1 would never join, and rank 0 would time out."""
    import os
    import sys
    import threading
    import time

    if comm.rank == 1:
        deadline = time.monotonic() + 60
        while not os.path.exists(signal_path):
            if time.monotonic() > deadline:
                return "rank 0 never signalled"
            time.sleep(0.001)
        comm.all_reduce(np.ones(4))
        return "joined"
    go = threading.Event()

    def signal() -> None:
        go.wait()
        with open(signal_path, "w"):
            pass

    helper = threading.Thread(target=signal)
    helper.start()
    # Make the interpreter hand the GIL over only when a thread releases it, so the
    # helper cannot slip in between go.set() and the wait below.
    previous = sys.getswitchinterval()
    sys.setswitchinterval(10.0)
    try:
        work = comm.all_reduce(np.ones(4), async_op=True)
        go.set()
        work._handle.wait(-1.0)  # the engine's blocking wait, in one piece
    finally:
        sys.setswitchinterval(previous)
    helper.join()
    return "completed"


def test_gil_is_released_while_a_collective_waits(group_factory, tmp_path):
    signal = str(tmp_path / "rank0-thread-ran")
    assert group_factory(2).run(_gil_released_while_waiting, signal) == ["completed", "joined"]


def _algorithm_counts(comm, count):
    before = comm.stats()["small_message_ops"]
    comm.all_reduce(np.ones(count, dtype=np.float32))
    return comm.stats()["small_message_ops"] - before


@pytest.mark.parametrize(
    "links,n,dtype", over_links(["float16", "bfloat16", "float64", "int8", "uint8"], [2, 3, 5, 8])
)
@pytest.mark.parametrize("path", ["ring", "small"])
def test_all_reduce_exact_on_each_path(group_factory, links, n, dtype, path):
    # Force one algorithm at every size: the ring (threshold 0) or the
    # small-message path (threshold far above every test size).
    group = group_factory(n, small_bytes=0 if path == "ring" else 1 << 30, transport=links)
    assert group.run(_all_reduce_exact, dtype) == [[]] * n
    # stats() says which path ran.
    assert group.run(_algorithm_counts, 1000) == [1 if path == "small" else 0] * n


@pytest.mark.parametrize("n", [2, 4])
def test_default_threshold_picks_small_path_only_for_small_messages(group_factory, links, n):
    group = group_factory(n, transport=links)
    assert group.run(_algorithm_counts, 16) == [1] * n  # 64 bytes
    assert group.run(_algorithm_counts, 1 << 20) == [0] * n  # 4 MB
