"""reduce, gather, scatter, all_to_all and point-to-point send/recv on real rank
processes, checked against numpy references (bit for bit: the data is exact), on every
transport, N in 1..5, sizes not divisible by N; and their errors."""

from __future__ import annotations

import numpy as np
import pytest

import ringreduce as rr

from _data import DTYPES, FLOATING, OPS, contribution, expected, np_dtype, same_bits, sizes_for
from _ranks import run_ranks

WORLD_SIZES = [1, 2, 3, 4, 5]
# TCP at every size; shared memory, and both at once, at 2 and 3 ranks.
SIZES_AND_LINKS = [(n, "tcp") for n in WORLD_SIZES] + [
    (n, links) for links in ("shm", "shm+tcp") for n in (2, 3)
]


def _sizes(n):
    return [c for c in sizes_for(n) if c < 2000] + [4099]


# ---- rank-side functions (module level so they pickle by reference) -------


def _reduce(comm, dtype):
    failures = []
    n, r = comm.world_size, comm.rank
    for root in sorted({0, n - 1, n // 2}):
        for op in OPS:
            if op == "avg" and dtype not in FLOATING:
                continue
            for count in _sizes(n):
                x = contribution(r, count, dtype, op)
                got = comm.reduce(x, op=op, root=root)
                if not same_bits(x, contribution(r, count, dtype, op)):
                    failures.append(f"root={root} {op} count={count}: input modified")
                if r == root:
                    if got is None or not same_bits(got, expected(n, count, dtype, op)):
                        failures.append(f"root={root} {op} count={count}")
                elif got is not None:
                    failures.append(f"root={root} {op}: rank {r} got {type(got)}, not None")
        # In place on root; out= on root.
        x = contribution(r, 97, dtype, "sum")
        res = comm.reduce(x, root=root, out=x if r == root else None)
        if r == root and (res is not x or not same_bits(x, expected(n, 97, dtype, "sum"))):
            failures.append(f"root={root} in place")
        if r != root and not same_bits(x, contribution(r, 97, dtype, "sum")):
            failures.append(f"root={root}: non-root input modified")
    return failures


def _gather(comm, dtype):
    failures = []
    n, r = comm.world_size, comm.rank
    for root in range(n):
        for count in _sizes(n):
            x = contribution(r, count, dtype, "sum")
            got = comm.gather(x, root=root)
            if r == root:
                want = np.stack([contribution(k, count, dtype, "sum") for k in range(n)])
                if got is None or not same_bits(got, want):
                    failures.append(f"root={root} count={count}")
            elif got is not None:
                failures.append(f"root={root}: rank {r} got {type(got)}")
    # Multi-dimensional blocks and out=.
    x = contribution(r, 12, dtype, "sum").reshape(3, 4)
    out = np.zeros((n, 3, 4), np_dtype(dtype)) if r == 0 else None
    got = comm.gather(x, root=0, out=out)
    if r == 0:
        want = np.stack([contribution(k, 12, dtype, "sum").reshape(3, 4) for k in range(n)])
        if got is not out or not same_bits(out, want):
            failures.append("3-d out=")
    return failures


def _scatter(comm, dtype):
    failures = []
    n, r = comm.world_size, comm.rank
    for root in range(n):
        for count in _sizes(n):
            full = np.stack([contribution(k + 7, count, dtype, "sum") for k in range(n)])
            if r == root:
                got = comm.scatter(full, root=root)
            else:
                out = np.full(count, 99, np_dtype(dtype))
                got = comm.scatter(root=root, out=out)
                if got is not out:
                    failures.append(f"root={root} count={count}: out= not returned")
            if not same_bits(got, full[r]):
                failures.append(f"root={root} count={count}")
    return failures


def _all_to_all(comm, dtype):
    failures = []
    n, r = comm.world_size, comm.rank

    def block(src, dst, rows, width):
        return contribution(src * 31 + dst, rows * width, dtype, "sum").reshape(rows, width)

    # Equal blocks: first dimension cut into n.
    for rows in (0, 1, 3, 50):
        x = np.concatenate([block(r, d, rows, 5) for d in range(n)])
        got = comm.all_to_all(x)
        want = np.concatenate([block(s, r, rows, 5) for s in range(n)])
        if not same_bits(got, want):
            failures.append(f"equal rows={rows}")

    # Unequal: rank s sends (s + 2 d) % 4 rows to d (some zero).
    def rows(s, d):
        return (s + 2 * d + 1) % 4 if n > 1 else 3

    sends = [rows(r, d) for d in range(n)]
    recvs = [rows(s, r) for s in range(n)]
    x = np.concatenate([block(r, d, sends[d], 3) for d in range(n)])
    got = comm.all_to_all(x, send_counts=sends, recv_counts=recvs)
    want = np.concatenate([block(s, r, recvs[s], 3) for s in range(n)])
    if not same_bits(got, want):
        failures.append(f"unequal sends={sends} recvs={recvs}")
    # Asynchronous, with out=.
    out = np.empty_like(want)
    work = comm.all_to_all(x, send_counts=sends, recv_counts=recvs, out=out, async_op=True)
    if work.wait() is not out or not same_bits(out, want):
        failures.append("async out=")
    return failures


def _p2p_ring(comm, dtype):
    """Every rank sends to the next and receives from the previous, several tags,
    messages of many sizes (some larger than a segment)."""
    failures = []
    n, r = comm.world_size, comm.rank
    nxt, prv = (r + 1) % n, (r - 1) % n
    for count in (0, 1, 7, 4099, 300_000):
        works = [
            comm.send(contribution(r + t, count, dtype, "sum"), nxt, tag=t, async_op=True)
            for t in range(3)
        ]
        # Receive the tags in reverse order: matching is by tag, not arrival.
        for t in reversed(range(3)):
            out = np.empty(count, np_dtype(dtype))
            src = comm.recv(out, prv, tag=t)
            if src != prv or not same_bits(out, contribution(prv + t, count, dtype, "sum")):
                failures.append(f"count={count} tag={t} from {src}")
        for w in works:
            w.wait()
    return failures


def _p2p_any_source(comm):
    """Rank 0 takes one message from each other rank, from any source, in arrival order."""
    n, r = comm.world_size, comm.rank
    if r == 0:
        got = {}
        for _ in range(n - 1):
            out = np.empty(4, np.int64)
            src = comm.recv(out, None, tag=5)
            got[src] = out.tolist()
        return got
    comm.send(np.full(4, 10 * r, np.int64), 0, tag=5)
    return None


def _p2p_ordered(comm):
    """Messages between two ranks with one tag arrive in the order they were sent."""
    if comm.rank == 0:
        for i in range(50):
            comm.send(np.array([i], np.int32), 1, tag=2)
        return None
    seen = []
    for _ in range(50):
        out = np.empty(1, np.int32)
        comm.recv(out, 0, tag=2)
        seen.append(int(out[0]))
    return seen


def _p2p_with_collectives(comm):
    """Point-to-point traffic in flight while collectives run: neither disturbs the other."""
    n, r = comm.world_size, comm.rank
    out = np.empty(1000, np.float64)
    recv = comm.recv(out, (r - 1) % n, tag=9, async_op=True)
    total = comm.all_reduce(np.full(10_000, float(r)))
    comm.send(np.full(1000, float(r)), (r + 1) % n, tag=9)
    src = recv.wait()
    return (
        src == (r - 1) % n
        and bool(np.all(out == (r - 1) % n))
        and bool(np.all(total == sum(range(n))))
    )


def _p2p_size_mismatch(comm):
    if comm.rank == 0:
        comm.send(np.zeros(10, np.float32), 1)
        comm.barrier()
        return None
    try:
        comm.recv(np.zeros(12, np.float32), 0)
    except rr.MismatchError as exc:
        comm.barrier()
        return str(exc)
    return "no error"


def _p2p_after_rank_0_closed(comm, marker):
    """Rank 0, the store's host, closes first; ranks 1 and 2 then exchange their first
    messages (links made on first use)."""
    import os
    import time

    if comm.rank == 0:
        comm.close()
        open(marker, "w").close()
        return None
    deadline = time.monotonic() + 30
    while not os.path.exists(marker) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert os.path.exists(marker), "rank 0 did not close within 30 s"
    peer = 3 - comm.rank
    got = np.empty(5, np.float64)
    work = comm.send(np.full(5, comm.rank, np.float64), peer, async_op=True)
    comm.recv(got, peer)
    work.wait()
    return got.tolist()


def _recv_from_silent_rank(comm):
    if comm.rank == 1:
        try:
            comm.recv(np.zeros(4, np.float32), 0, tag=3)
        except rr.TimeoutError as exc:
            return str(exc)
        return "no error"
    return None


def _bad_arguments(comm):
    n, r = comm.world_size, comm.rank
    x = np.zeros(6, np.float32)
    cases = [
        (lambda: comm.reduce(x, root=n), ValueError),
        (lambda: comm.reduce(x, root=-1), ValueError),
        (lambda: comm.gather(x, root="0"), ValueError),
        (lambda: comm.scatter(np.zeros((n + 1, 2), np.float32), root=r), ValueError),
        (lambda: comm.scatter(root=(r + 1) % n), ValueError),  # non-root without out=
        (lambda: comm.all_to_all(np.zeros(n * 2 + 1, np.float32)), ValueError),
        (lambda: comm.all_to_all(x, send_counts=[6], recv_counts=[6] * n), ValueError),
        (
            lambda: comm.all_to_all(x, send_counts=[7] + [0] * (n - 1), recv_counts=[0] * n),
            ValueError,
        ),
        (lambda: comm.all_to_all(x, send_counts=[-1] * n, recv_counts=[0] * n), ValueError),
        (lambda: comm.send(x, r), ValueError),
        (lambda: comm.send(x, n), ValueError),
        (lambda: comm.recv(x, r), ValueError),
        (lambda: comm.recv(np.zeros(3, np.float32)[::2], None), ValueError),
    ]
    from _data import expect_errors

    errors = expect_errors(cases)
    # The communicator still works after every refused call.
    if not np.all(comm.all_reduce(np.ones(5)) == n):
        errors.append("all_reduce after bad arguments")
    return errors


def _mismatched_splits(comm):
    """Rank 0 sends 2 rows to rank 1, which expects 3: both must say so, naming the
    other rank."""
    n, r = comm.world_size, comm.rank
    sends = [1] * n
    recvs = [1] * n
    if r == 0:
        sends[1] = 2
    if r == 1:
        recvs[0] = 3
    x = np.zeros(sum(sends), np.float32)
    try:
        comm.all_to_all(x, send_counts=sends, recv_counts=recvs)
    except rr.MismatchError as exc:
        return str(exc)
    return "no error"


def _roots_differ(comm):
    try:
        comm.reduce(np.ones(8, np.float32), root=comm.rank % 2)
    except rr.MismatchError as exc:
        return str(exc)
    return "no error"


# ---- tests ---------------------------------------------------------------


@pytest.mark.parametrize("n", WORLD_SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_reduce_every_dtype_op_root(group_factory, n, dtype):
    assert group_factory(n).run(_reduce, dtype) == [[]] * n


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("dtype", ["float32", "int64"])
def test_reduce_on_other_links(group_factory, links, n, dtype):
    assert group_factory(n, transport=links).run(_reduce, dtype) == [[]] * n


@pytest.mark.parametrize("n,links", SIZES_AND_LINKS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float64", "int8"])
def test_gather(group_factory, links, n, dtype):
    assert group_factory(n, transport=links).run(_gather, dtype) == [[]] * n


@pytest.mark.parametrize("n,links", SIZES_AND_LINKS)
@pytest.mark.parametrize("dtype", ["float16", "int32", "uint8"])
def test_scatter(group_factory, links, n, dtype):
    assert group_factory(n, transport=links).run(_scatter, dtype) == [[]] * n


@pytest.mark.parametrize("n,links", SIZES_AND_LINKS)
@pytest.mark.parametrize("dtype", ["float32", "int64", "bfloat16"])
def test_all_to_all_equal_and_unequal(group_factory, links, n, dtype):
    assert group_factory(n, transport=links).run(_all_to_all, dtype) == [[]] * n


@pytest.mark.parametrize("n", [2, 3, 5])
def test_send_recv_tags_and_sizes(group_factory, links, n):
    assert group_factory(n, transport=links).run(_p2p_ring, "float32") == [[]] * n


def test_recv_from_any_source(group_factory, links):
    got = group_factory(4, transport=links).run(_p2p_any_source)[0]
    assert got == {1: [10] * 4, 2: [20] * 4, 3: [30] * 4}


def test_messages_with_one_tag_arrive_in_order(group_factory, links):
    assert group_factory(2, transport=links).run(_p2p_ordered)[1] == list(range(50))


def test_point_to_point_alongside_collectives(group_factory, links):
    assert group_factory(3, transport=links).run(_p2p_with_collectives) == [True] * 3


def test_point_to_point_needs_no_store_after_init(links, tmp_path):
    """A first message between two ranks works after rank 0, whose process holds the
    store, has closed: every address a link needs was read when the communicator was
    made."""
    marker = str(tmp_path / "closed")
    outcomes = run_ranks(3, _p2p_after_rank_0_closed, marker, transport=links, timeout=60)
    got = [o[:2] for o in outcomes]
    assert got == [("ok", None), ("ok", [2.0] * 5), ("ok", [1.0] * 5)], outcomes


def test_recv_of_the_wrong_size_is_a_mismatch_naming_the_sender(group_factory):
    msg = group_factory(2).run(_p2p_size_mismatch)[1]
    assert "rank 0" in msg and "40" in msg and "48" in msg, msg


def test_recv_from_a_rank_that_never_sends_times_out_naming_it():
    outcomes = run_ranks(2, _recv_from_silent_rank, init_timeout=3.0, timeout=60)
    msg = outcomes[1][1]
    assert outcomes[1][0] == "ok", outcomes
    assert "rank 0" in msg and "tag=3" in msg, msg


@pytest.mark.parametrize("n", [2, 3])
def test_bad_arguments_are_refused_before_anything_is_sent(group_factory, n):
    assert group_factory(n).run(_bad_arguments) == [[]] * n


@pytest.mark.parametrize("links", ["tcp", "shm"])
def test_mismatched_all_to_all_splits_fail_on_both_ranks(links):
    outcomes = run_ranks(3, _mismatched_splits, transport=links, timeout=60)
    assert [o[0] for o in outcomes] == ["ok"] * 3, outcomes
    msgs = [o[1] for o in outcomes]
    for r in (0, 1):
        assert msgs[r] != "no error" and "rank 0" in msgs[r] and "rank 1" in msgs[r], msgs
        assert "rank 0 sends 2 elements to rank 1, which expects 3" in msgs[r], msgs


def test_ranks_naming_different_roots_get_mismatch_error():
    outcomes = run_ranks(2, _roots_differ, timeout=60)
    msgs = [o[1] for o in outcomes]
    assert all(m != "no error" and "root" in m for m in msgs), msgs
