"""Several TCP connections (streams) per link, messages striped across them
(RINGREDUCE_TCP_STREAMS): the same results, bit for bit, as one stream; the
connections really are there; failures still name the rank."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

import ringreduce as rr

from _data import all_reduce_exact_failures
from _ranks import RankGroup, run_ranks


def _random_collectives(comm, seed: int):
    """Mixed collectives on random integer-valued data (exact in any order of
    addition), sizes below and above the striping threshold and not multiples of
    a page; returns, per check, whether it held."""
    rng = np.random.default_rng(seed + comm.rank)
    n, r = comm.world_size, comm.rank
    checks = []
    for count in (1, 1000, 16_383, 16_385, 300_001, 1 << 20):
        x = rng.integers(-1000, 1000, count).astype(np.float32)
        everyone = comm.all_gather(x).reshape(n, count)  # every rank's input
        want = everyone.sum(axis=0, dtype=np.float32)
        checks.append(bool(np.array_equal(comm.all_reduce(x), want)))
        # Several calls in flight at once on the engine's thread.
        works = [comm.all_reduce(x * (i + 1), async_op=True) for i in range(3)]
        checks += [bool(np.array_equal(w.wait(), want * (i + 1))) for i, w in enumerate(works)]
        b = comm.broadcast(x if r == 0 else np.empty_like(x), root=0)
        checks.append(bool(np.array_equal(b, everyone[0])))
    per = 70_001
    blocks = np.arange(n * per, dtype=np.int64) + 1_000_000 * r
    got = comm.all_to_all(blocks)
    want = np.concatenate(
        [np.arange(r * per, (r + 1) * per, dtype=np.int64) + 1_000_000 * k for k in range(n)]
    )
    checks.append(bool(np.array_equal(got, want)))
    return checks


def _exact(comm):
    return all_reduce_exact_failures(comm, "float32") + all_reduce_exact_failures(comm, "int64")


def _socket_count(comm):
    comm.barrier()
    fds = os.listdir("/proc/self/fd")
    sockets = 0
    for fd in fds:
        try:
            sockets += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return sockets


@pytest.mark.parametrize("n,streams", [(2, 4), (3, 3), (4, 2)])
def test_striped_links_give_the_same_results(n, streams):
    env = {"RINGREDUCE_TCP_STREAMS": str(streams)}
    with RankGroup(n, env=env) as group:
        assert group.run(_exact) == [[]] * n
        for result in group.run(_random_collectives, 7, timeout=180):
            assert all(result), result


@pytest.mark.parametrize("segment", [4096, 200_000, 1 << 20])
def test_striping_with_other_segment_sizes(segment):
    env = {"RINGREDUCE_TCP_STREAMS": "3", "RINGREDUCE_SEGMENT_BYTES": str(segment)}
    with RankGroup(3, env=env) as group:
        for result in group.run(_random_collectives, 11, timeout=180):
            assert all(result), result


def test_each_link_opens_as_many_connections_as_streams():
    # At 2 ranks each rank sends on one link and receives on one: S sockets each.
    counts = {}
    for streams in (1, 4):
        with RankGroup(2, env={"RINGREDUCE_TCP_STREAMS": str(streams)}) as group:
            counts[streams] = group.run(_socket_count)
    assert [b - a for a, b in zip(counts[1], counts[4])] == [2 * 3, 2 * 3], counts


def _exit_during_a_big_call(comm):
    if comm.rank == 1:
        time.sleep(0.3)
        os._exit(3)
    t0 = time.monotonic()
    try:
        comm.all_reduce(np.ones(64 << 20, dtype=np.float32))
    except rr.RingReduceError as exc:
        return type(exc).__name__, exc.peer, time.monotonic() - t0
    return "no error", None, 0.0


def test_a_rank_that_exits_mid_call_is_named_on_striped_links():
    outcomes = run_ranks(
        3,
        _exit_during_a_big_call,
        timeout=60,
        init_timeout=20,
        env={"RINGREDUCE_TCP_STREAMS": "4"},
    )
    assert outcomes[1][0] == "dead"
    for rank in (0, 2):
        status, (kind, peer, seconds), _ = outcomes[rank]
        assert status == "ok" and kind == "PeerError" and peer == 1, outcomes[rank]
        assert seconds < 15


@pytest.mark.parametrize("value", ["17", "-1", "two"])
def test_bad_stream_counts_are_refused_by_name(monkeypatch, value):
    monkeypatch.setenv("RINGREDUCE_TCP_STREAMS", value)
    with pytest.raises(ValueError, match="RINGREDUCE_TCP_STREAMS"):
        rr.init("tcp", rank=0, world_size=1)
