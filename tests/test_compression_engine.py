"""The compressed all_reduce and reduce_scatter as engine collectives (the one-hop
schedule of csrc/algorithms/one_hop.h): one collective and one call header per call,
the codec in the header, queued like any other call, and the bits of the Python path
(compressed/hop.py, which codecs with methods of their own still take)."""

from __future__ import annotations

import _compression_engine_rank as er
import _compression_rank as cr
import numpy as np
import pytest
from _compression_rank import contribution

from ringreduce.compression import get_codec

from _ranks import run_ranks

pytest.importorskip("ml_dtypes")


def test_a_compressed_call_is_one_engine_collective_and_counts_its_bytes():
    # A fresh communicator: nothing another test left in flight moves its counters.
    n_ranks, n = 3, 1 << 15
    outcomes = run_ranks(n_ranks, er.one_collective, n)
    assert all(status == "ok" for status, _, _ in outcomes), outcomes
    for got, engine in (value for _, value, _ in outcomes):
        for what, (ops, sent, wire) in got.items():
            assert ops == 1, (what, ops)  # one call header, one collective
            assert wire == sent, (what, wire, sent)  # the codec's stats are the engine's
        ring = 2 * (n_ranks - 1) / n_ranks
        payload = get_codec("int8").payload_bytes(n)
        assert ring * payload <= got["all_reduce"][1] <= ring * payload * 1.03 + 256
        assert got["reduce_scatter"][1] < 0.55 * got["all_reduce"][1]
        assert engine["calls"] >= 2 and engine["codec_seconds"] > 0


@pytest.mark.parametrize(
    "codecs, named",
    [
        (("int8", "bf16"), ("compression=int8", "compression=bf16")),
        (("int8", None), ("compression=int8", "all_reduce(count=1000, float32, sum)")),
    ],
)
def test_ranks_whose_codecs_differ_raise_naming_both(codecs, named):
    """A fresh communicator each: the mismatch breaks it, as any does."""
    outcomes = run_ranks(2, er.codecs_differ, codecs)
    for status, (kind, text), tb in outcomes:
        assert status == "ok", tb
        assert kind == "MismatchError", (kind, text)
        assert "rank 0" in text and "rank 1" in text and all(s in text for s in named), text


def test_no_call_waits_for_another_to_be_issued(group_factory):
    """Rank 0's async compressed, exact and compressed calls all return before rank 1
    has issued any (it waits for rank 0's message first), so none of them can have
    finished: none waited for the one before. They complete in issue order."""
    results = group_factory(2).run(er.nothing_waits)
    pending, got0 = results[0]
    assert pending == [True, True, True]
    got1 = results[1][1]
    assert got0[0].tobytes() == got1[0].tobytes()
    exact = contribution(0, 1000, "float32").astype(np.float64) + contribution(1, 1000, "float32")
    np.testing.assert_allclose(got0[1], exact, rtol=1e-6)
    np.testing.assert_allclose(np.concatenate([got0[2], got1[2]]), exact, atol=0.05)
    big = contribution(0, 1 << 20, "float32").astype(np.float64) + contribution(
        1, 1 << 20, "float32"
    )
    np.testing.assert_allclose(got0[0], big, atol=0.2)


@pytest.mark.parametrize("kernels", [True, False], ids=["engine", "python"])
def test_an_async_calls_canary_turns_the_next_call_exact_on_every_rank(group_factory, kernels):
    """The three calls of test_canary_falls_back_once_and_says_so, queued: the first's
    canary trips, and the next two run exact on every rank, on both paths."""
    name = f"int8-async-canary-{'engine' if kernels else 'python'}"
    results = group_factory(2).run(cr.canary, name, True, kernels)
    for said, first, second, third, exact, stat in results:
        assert len(said) == 1 and name in said[0] and "exact" in said[0], said
        assert stat["fell_back"] and stat["fallbacks"] == 2 and stat["canary_checks"] == 1
        assert second.tobytes() == exact.tobytes() == third.tobytes()
        assert first.tobytes() != exact.tobytes()
    assert results[0][1].tobytes() == results[1][1].tobytes()


@pytest.mark.parametrize("codec", ["bf16", "fp16", "int8", "int4"])
@pytest.mark.parametrize(
    "dtype, op, scatter, feedback",
    [
        ("float32", "sum", False, False),
        ("bfloat16", "avg", False, True),
        ("float16", "sum", True, False),
        ("float32", "avg", True, True),
    ],
)
def test_the_engine_gives_the_python_paths_bits(group_factory, codec, dtype, op, scatter, feedback):
    """The engine's schedule against the Python path with the codecs' numpy methods, on
    the same seeds: results and residuals bit for bit, at 3 ranks (uneven chunks)."""
    results = group_factory(3).run(er.engine_and_python_paths, codec, dtype, op, scatter, feedback)
    for (engine, python), residuals in results:
        assert engine.dtype == python.dtype and engine.shape == python.shape
        assert engine.tobytes() == python.tobytes(), (codec, dtype, op, scatter)
        if feedback:
            assert residuals[0].tobytes() == residuals[1].tobytes()
            assert np.any(residuals[0] != 0)


def test_an_exact_call_that_owes_a_residual_is_queued_on_the_engine(group_factory):
    """auto keeps a small call exact; with error feedback its residual is sent along.
    That too is one engine collective (float32 rows), queued, not run on the lane, so
    a GradSync step mixing such buckets with compressed ones never waits at issue."""
    for kind, lane, got, want, residual in group_factory(2).run(er.exact_with_residual):
        assert kind == "Work" and not lane, (kind, lane)
        assert got.tobytes() == want.tobytes()  # 2 ranks: one float32 sum, in any order
        assert not residual.any()
