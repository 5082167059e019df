"""Compressed calls with async_op=True run in the background, in issue order: on the
engine's queue (the built-in codecs' collective), or on the communicator's lane
(_comm/compressed/lane.py) for the calls the engine does not take, with every other call
issued meanwhile behind them."""

from __future__ import annotations

import _lane_rank as lr
import numpy as np
import pytest
from _compression_rank import contribution

import ringreduce as rr

from _ranks import RankGroup


def _exact_sums(n_ranks):
    return [
        sum(contribution(r + i, n, "float32").astype(np.float64) for r in range(n_ranks))
        for i, n in enumerate(lr.SIZES)
    ]


@pytest.mark.parametrize("kernels", [True, False], ids=["engine", "lane"])
@pytest.mark.parametrize("codec", ["int8", "bf16"])
def test_async_calls_keep_the_programs_order(group_factory, codec, kernels):
    """Exact and blocking calls issued while async compressed calls are in the lane
    wait for them: every rank ends with the same bits, every result is the right sum
    (within the codec's bound), and the calls keep their numbers, so the results equal
    those of the same calls made blocking (bit for bit for bf16, which has no dither;
    int8's dither is seeded by the call's number, which differs between the runs)."""
    n_ranks = 3
    results = group_factory(n_ranks).run(lr.in_both_orders, codec, kernels)
    sums = _exact_sums(n_ranks)
    tol = 0.05 if codec == "bf16" else 0.2
    for rank, got in enumerate(results):
        lo, hi = rr.chunk_bounds(lr.SIZES[3], n_ranks, rank)
        if kernels:  # the engine's collectives: the lane never starts
            assert got["lanes"] == [[]], got["lanes"]
        else:
            assert got["lanes"] == [[]] or got["lanes"] == [["ringreduce-lane"]]
        for mode in ("async", "blocking"):
            a, b, exact, c, blocking, exact_async, d = got[mode]
            np.testing.assert_allclose(a, sums[0], atol=tol)
            np.testing.assert_allclose(b, sums[1] / n_ranks, atol=tol)
            np.testing.assert_allclose(exact, sums[2], atol=1e-4)
            np.testing.assert_allclose(blocking, sums[2], atol=tol)
            np.testing.assert_allclose(exact_async, sums[0], atol=1e-4)
            np.testing.assert_allclose(d, sums[1], atol=tol)
            np.testing.assert_allclose(c, sums[3][lo:hi], atol=tol)
            for i, (mine, first) in enumerate(zip(got[mode], results[0][mode])):
                if i != 3:  # c: each rank's own block
                    assert mine.tobytes() == first.tobytes(), (mode, i)
        if codec == "bf16":
            for x, y in zip(got["async"], got["blocking"]):
                assert x.tobytes() == y.tobytes()


def test_an_async_call_returns_before_its_peers_have_issued(group_factory):
    results = group_factory(2).run(lr.overlaps, "int8")
    assert results[0]["pending"] is True
    assert results[0]["y"].tobytes() == results[1]["y"].tobytes()
    exact = contribution(0, 100_000, "float32").astype(np.float64) + contribution(
        1, 100_000, "float32"
    )
    np.testing.assert_allclose(results[0]["y"], exact, atol=0.2)
    for got in results:
        np.testing.assert_array_equal(got["after"], np.full(4, 2, np.float32))


def test_a_failure_in_the_lane_is_raised_by_wait_naming_the_peer():
    # A group of its own: a rank exits, and a shared group could be handed to the next
    # test while its ranks are still going away.
    with RankGroup(2, timeout=60, transport="tcp") as group:
        outcomes = group.outcomes(lr.failure_reaches_wait, "int8", timeout=90)
    status, got, tb = outcomes[0]
    assert status == "ok", tb
    assert got["error"] == "PeerError", got
    assert got["peer"] == 1, got


def test_each_call_is_issued_from_the_same_thread_on_every_rank(group_factory):
    results = group_factory(2).run(lr.same_thread_whatever_the_lane, "int8")
    for key in ("blocking", "first", "big", "tiny", "after"):
        assert results[0][key].tobytes() == results[1][key].tobytes(), key
    exact = sum(contribution(r, 100, "float32").astype(np.float64) for r in range(2))
    np.testing.assert_allclose(results[0]["tiny"], exact, atol=1e-5)
    np.testing.assert_array_equal(results[0]["after"], np.full(4, 2, np.float32))
