"""Compressed all_reduce and reduce_scatter (docs/compression.md): every codec x dtype x
world size 1..5 x sizes not divisible by the block (512) or the world size, against a
float64 reference with each codec's stated bound; bitwise identity across ranks; error
feedback; the canary; auto; refusals."""

from __future__ import annotations

import _compression_rank as cr
import numpy as np
import pytest

import ringreduce as rr
from ringreduce.compression import (
    BLOCK,
    BlockIntCodec,
    Codec,
    ErrorFeedback,
    codec_names,
    get_codec,
    register_codec,
)
from ringreduce.compression.policy import MIN_BYTES, AutoPolicy

from _ranks import run_ranks

SIZES = (1, 7, 4099)  # 4099: prime, so no world size or block divides it


def _reference(n_ranks, n, dtype):
    parts = [cr.contribution(r, n, dtype).astype(np.float64) for r in range(n_ranks)]
    return parts, np.sum(parts, axis=0)


def _step(codec, values):
    """The largest error one encode of ``values`` may make, per value (the bound each
    codec states in docs/compression.md): bf16 half an ulp (2**-8 relative), fp16 2**-11
    relative plus 2**-40 of the largest |value| (subnormals), int8/int4 one scale step
    (largest |value| / 127 or / 7; the block's largest is at most the array's)."""
    mags = np.abs(values)
    top = mags.max(initial=0.0)
    if codec == "bf16":
        return mags * 2.0**-8
    if codec == "fp16":
        return mags * 2.0**-11 + top * 2.0**-40
    return np.full_like(mags, top / (127 if codec == "int8" else 7))


_OUT_EPS = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}


def _bounds(codec, dtype, parts, exact):
    """(reduce_scatter's bound, all_reduce's): each contribution quantized once, then
    the owner's sum once more (all_reduce), then the result rounded to the input dtype."""
    scattered = sum(_step(codec, p) for p in parts)
    reduced = scattered + _step(codec, np.abs(exact) + scattered)
    out = lambda b: b + (np.abs(exact) + b) * _OUT_EPS[dtype]  # noqa: E731
    return out(scattered), out(reduced)


@pytest.mark.parametrize("n_ranks", [1, 2, 3, 4, 5])
def test_every_codec_dtype_and_size_within_bound_and_identical(group_factory, n_ranks):
    results = group_factory(n_ranks).run(cr.matrix, SIZES)
    for (codec, dtype, n), (y, _, _) in results[0].items():
        parts, exact = _reference(n_ranks, n, dtype)
        rs_bound, ar_bound = _bounds(codec, dtype, parts, exact)
        assert y.dtype == cr.DTYPES[dtype] and y.shape == (n,)
        err = np.abs(y.astype(np.float64) - exact)
        assert (err <= ar_bound).all(), (codec, dtype, n, float((err - ar_bound).max()))
        blocks = np.concatenate([r[codec, dtype, n][1] for r in results]).astype(np.float64)
        assert blocks.shape == (n,)
        assert (np.abs(blocks - exact) <= rs_bound).all(), (codec, dtype, n, "reduce_scatter")
        for r in range(1, n_ranks):
            assert results[r][codec, dtype, n][0].tobytes() == y.tobytes(), (codec, dtype, n, r)
        assert all(res[codec, dtype, n][2] for res in results), "input modified"


# Relative L2 error on Gaussian data at 4 ranks, 4099 values (what docs/compression.md
# states as typical), with room: the bound above is the worst case per value.
TYPICAL = {"bf16": 4e-3, "fp16": 5e-4, "int8": 2.5e-2, "int4": 0.4}


def test_typical_errors_per_codec(group_factory):
    results = group_factory(4).run(cr.matrix, (4099,))
    for codec, limit in TYPICAL.items():
        _, exact = _reference(4, 4099, "float32")
        y = results[0][codec, "float32", 4099][0].astype(np.float64)
        assert np.linalg.norm(y - exact) / np.linalg.norm(exact) < limit, codec


@pytest.mark.parametrize("codec", ["int8", "bf16"])
def test_avg_out_in_place_async_and_blocks(group_factory, codec):
    """Each call is its own draw of int8's stochastic rounding (seeded by the call's
    number): its results agree within the bound, bf16's bit for bit."""
    n_ranks = 3
    results = group_factory(n_ranks).run(cr.average_and_outputs, codec)
    same = (
        np.testing.assert_array_equal
        if codec == "bf16"
        else (lambda a, b: np.testing.assert_allclose(a, b, atol=0.2))
    )
    for r, got in enumerate(results):
        total = got["total"]
        assert total.shape == (40, 25) and total.dtype == np.float32
        same(got["avg"], total / np.float32(n_ranks))
        assert got["out_is_out"] and got["inplace_is_x"] and got["block_is_out"]
        for key in ("out", "inplace", "waited"):
            same(got[key], total)
            assert got[key].tobytes() == results[0][key].tobytes(), key
        assert got["done"]
        lo, hi = rr.chunk_bounds(1000, n_ranks, r)
        assert got["block"].shape == (hi - lo,)
        # The block is the owner's float32 sum, before all_reduce's re-encode of it.
        np.testing.assert_allclose(got["block"], total.reshape(-1)[lo:hi], atol=0.2, rtol=2**-7)
        assert got["avg"].tobytes() == results[0]["avg"].tobytes()


def test_refusals_name_the_problem(group_factory):
    results = group_factory(2).run(cr.refusals)
    for got in results:
        assert got["int32"][0] == "ValueError" and "int32" in got["int32"][1]
        assert got["float64"][0] == "ValueError" and "float64" in got["float64"][1]
        kind, text = got["unknown"]
        assert kind == "ValueError" and all(repr(c) in text for c in codec_names())
        assert got["max"][0] == "ValueError" and "sum and avg" in got["max"][1]
        kind, text = got["length"]
        assert kind == "ValueError" and "'w'" in text and "7" in text and "10" in text
        assert got["feedback"][0] == "TypeError"
        np.testing.assert_allclose(got["after"], 2.0, rtol=0.02)
        np.testing.assert_array_equal(got["float64_auto"], np.full(4, 2.0))


def test_error_feedback_makes_averages_converge(group_factory):
    """The average of K calls of one input: with feedback its error is (last residuals)
    / K; without it, bf16 (deterministic rounding) repeats one error and int4
    (stochastic) shrinks only as 1/sqrt(K)."""
    group = group_factory(3)
    _, exact = _reference(3, 3000, "float32")
    k = 32

    def error(codec, calls, feedback):
        total, owed = group.run(cr.repeated, codec, calls, feedback)[0]
        return np.linalg.norm(total / calls - exact) / np.linalg.norm(exact), owed

    for codec in ("bf16", "int4"):
        one, _ = error(codec, 1, False)
        plain, _ = error(codec, k, False)
        fed, _ = error(codec, k, True)
        assert fed < 4.0 * one / k, (codec, one, fed)
        assert plain > 2.0 * fed, (codec, plain, fed)
    assert error("bf16", k, False)[0] > 0.5 * error("bf16", 1, False)[0]


def test_error_feedback_state():
    ef = ErrorFeedback()
    a = ef.key("layer1").key("w")
    res = a.residual(5)
    assert res.dtype == np.float32 and (res == 0).all()
    res += 1.5
    assert a.residual(5) is res and ef.key("layer1/w").residual(5) is res
    ef.key("b").residual(3)[:] = 2
    assert ef.keys() == ["b", "layer1/w"] and ef.key("layer1").keys() == ["w"]
    with pytest.raises(ValueError, match=r"'layer1/w'.* 5 values.* reduces 6"):
        a.residual(6)
    state = ef.state_dict()
    assert state["version"] == 1 and set(state["residuals"]) == {"b", "layer1/w"}
    res += 1  # the state is a copy
    fresh = ErrorFeedback()
    fresh.load_state_dict(state)
    np.testing.assert_array_equal(fresh.key("layer1").key("w").residual(5), np.full(5, 1.5))
    sub = ErrorFeedback()
    sub.key("model").load_state_dict(ef.key("layer1").state_dict())
    assert sub.keys() == ["model/w"]
    ef.key("layer1").reset()
    assert ef.keys() == ["b"]
    with pytest.raises(ValueError, match="version"):
        fresh.load_state_dict({"version": 99, "residuals": {}})


def test_error_feedback_checkpoint_resumes_bit_for_bit(group_factory):
    for third, resumed, first in group_factory(2).run(cr.feedback_round_trip):
        assert third.tobytes() == resumed.tobytes()
        assert third.tobytes() != first.tobytes()  # the residual did change the input


def test_canary_falls_back_once_and_says_so(group_factory):
    results = group_factory(2).run(cr.canary, "int8-canary-test")
    for said, first, second, third, exact, stat in results:
        assert len(said) == 1 and "int8-canary-test" in said[0] and "exact" in said[0]
        assert stat["fell_back"] and stat["fallbacks"] == 2 and stat["canary_checks"] == 1
        assert stat["compression_error"] > 0.1
        assert second.tobytes() == exact.tobytes() == third.tobytes()
        assert first.tobytes() != exact.tobytes()
    assert results[0][1].tobytes() == results[1][1].tobytes()


def test_wire_bytes_follow_payload(group_factory):
    n_ranks, n = 4, 1 << 16
    sent, stats = group_factory(n_ranks).run(cr.wire, n)[1]
    ring = 2 * (n_ranks - 1) / n_ranks
    for codec, per_value in (("bf16", 2), ("fp16", 2), ("int8", 1), ("int4", 0.5)):
        payload = get_codec(codec).payload_bytes(n)
        assert payload == n * per_value + (0 if codec == "bf16" else 4 * n // BLOCK)
        # Ring volume of the payload, plus the engine's headers and the rows' padding.
        assert ring * payload <= sent[codec] <= ring * payload * 1.03 + 2048, codec
        assert stats["wire_bytes"][codec] > 0 and stats["codec_seconds"][codec] > 0
    assert sent["int8"] < 0.27 * sent["exact"] and sent["bf16"] < 0.52 * sent["exact"]


@pytest.mark.parametrize("codec", ["int8", "int4", "fp16", "bf16"])
def test_inf_and_nan_propagate_like_the_exact_sum(group_factory, codec):
    results = group_factory(3).run(cr.non_finite, codec)
    with np.errstate(invalid="ignore"):
        exact = sum(x.astype(np.float64) for _, x in results)
    got = results[0][0]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(exact))
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(exact))
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(exact))
    finite = np.isfinite(exact)
    limit = {"int8": 0.1, "int4": 3.0, "fp16": 1e-2, "bf16": 0.05}[codec]
    assert np.abs(got[finite] - exact[finite]).max() < limit


def test_ranks_that_disagree_all_raise_naming_both_calls():
    # One engine collective per compressed call: its header carries the count and the
    # codec, so both ranks raise before any row travels, naming both calls; the
    # communicator is then broken, as after any collective whose ranks disagree (so a
    # fresh one, not a kept group).
    outcomes = run_ranks(2, cr.mismatch)
    assert all(status == "ok" for status, _, _ in outcomes), outcomes
    for (kind, text), (later, why) in (value for _, value, _ in outcomes):
        assert kind == "MismatchError" and "count=100" in text and "count=101" in text, text
        assert text.count("compression=int8") == 3, text  # this rank's call and both named
        assert later != "none" and "collective mismatch" in why, (later, why)


def test_custom_gather_codec_sums_exactly_in_rank_order(group_factory):
    n_ranks = 3
    results = group_factory(n_ranks).run(cr.custom)
    parts = [cr.contribution(r, 999, "float32") for r in range(n_ranks)]
    want = np.zeros(999, np.float32)
    for p in parts:
        want += p
    for r, (y, block, owed) in enumerate(results):
        assert y.tobytes() == want.tobytes() and owed == 0.0
        lo, hi = rr.chunk_bounds(999, n_ranks, r)
        assert block.tobytes() == want[lo:hi].tobytes()


def test_register_codec_checks():
    class Half(Codec):
        name = "half-test"
        algebra = "linear"

    with pytest.raises(ValueError, match="algebra"):
        bad = Half()
        bad.algebra = "magic"
        register_codec(bad)
    register_codec(Half())
    assert "half-test" in codec_names() and codec_names()[-1] == "auto"
    with pytest.raises(ValueError, match="registered already"):
        register_codec(Half())
    with pytest.raises(ValueError, match="'auto'"):
        register_codec(BlockIntCodec(8, "auto", 0.1))
    with pytest.raises(ValueError, match="'int8'"):
        get_codec("int3")
    assert BLOCK == 512


def test_auto_is_exact_over_shared_memory(group_factory):
    results = group_factory(2, transport="shm").run(cr.auto, 1 << 17, 3)
    for got, exact, stats in results:
        assert all(g.tobytes() == exact.tobytes() for g in got)
        assert "auto" not in stats  # decided without measuring: nothing to report


def test_auto_calibrates_then_agrees_on_every_rank(group_factory):
    results = group_factory(2).run(cr.auto, 1 << 17, 4)
    first = results[0]
    for got, exact, stats in results:
        assert got[0].tobytes() == exact.tobytes() == got[1].tobytes()  # calibration: exact
        assert stats["auto"]["link_gbs"] > 0
        assert sum(stats["auto"]["chosen"].values()) >= 4
        predicted = stats["auto"]["predicted_seconds"]  # the last decision's model
        assert predicted["bytes"] == (1 << 17) * 4
        alphas = stats["auto"]["call_seconds"]  # the tiny calls' seconds, per path
        assert predicted["exact"] == pytest.approx(
            alphas["exact"] + predicted["bytes"] / (stats["auto"]["link_gbs"] * 1e9)
        )
        assert alphas["int8"] > 0 and alphas["bf16"] > 0
        assert set(predicted) == {"bytes", "exact", "bf16", "int8"}
        assert all(t > 0 for t in predicted.values())
        assert set(stats["auto"]["crossover_bytes"]) == {"bf16", "int8"}
        for i in range(4):
            assert got[i].tobytes() == first[0][i].tobytes()


def test_auto_calibrates_on_finished_transfers_when_called_async():
    # A queued exact call returns at once: timed that way, auto took a TCP link for
    # 90-139 GB/s and never compressed under GradSync. Async auto calls run on the
    # lane (they return before they finish), where the calibration's calls are timed
    # blocking. A fresh communicator, so that these calls are its calibration.
    outcomes = run_ranks(2, cr.auto_async, 1 << 20, 3)
    assert all(kind == "ok" for kind, _, _ in outcomes), outcomes
    for _, (got, exact, stats, _), _ in outcomes:
        assert all(g.tobytes() == exact.tobytes() for g in got[:2])  # calibration: exact
        assert 0 < stats["auto"]["link_gbs"] < 20, stats["auto"]  # timed to the end
        # The calibration's timing calls through the codecs are not counted as calls.
        assert all(stats.get(c, {}).get("calls", 0) <= 1 for c in ("bf16", "int8")), stats


def test_auto_cost_model_chooses_by_link_speed_and_size():
    policy = AutoPolicy(4, "tcp")
    n = 1 << 22
    assert policy.decide(n, 4, "float32", False).calibrating
    # Agreed numbers: beta (s per input byte), alpha_exact, then per candidate (bf16,
    # int8) encode and decode seconds per value and alpha. 1 Gbit/s: compress.
    beta, ae, ab, ai = 8 / 1e9, 1e-3, 2e-3, 3e-3
    policy.agree(np.array([beta, ae, 2e-9, 2e-9, ab, 5e-9, 2e-9, ai]), 4 * n)
    slow = policy.decide(n, 4, "float32", False)
    assert slow.codec == "int8" and "int8" in slow.why and "exact" in slow.why
    int8 = get_codec("int8")
    assert policy.predicted["exact"] == pytest.approx(ae + 4 * n * beta)
    assert policy.predicted["int8"] == pytest.approx(
        ai + int8.payload_bytes(n) * beta + n * (5e-9 + 2 * 2e-9)
    )
    # The crossover: below it exact is predicted faster, above it the codec.
    cross = policy.crossover_bytes()
    assert 0 < cross["bf16"] < float("inf") and 0 < cross["int8"] < float("inf")
    for name in ("bf16", "int8"):
        below = policy.predict(int(cross[name] / 4 * 0.9), 4, False)[0]
        above = policy.predict(int(cross[name] / 4 * 1.1), 4, False)[0]
        assert below[name] > below["exact"] and above[name] < above["exact"], name
    # 20 GB/s: the codecs cost more than they save, at any size.
    policy.agree(np.array([1 / 20e9, ae, 2e-9, 2e-9, ab, 5e-9, 2e-9, ai]), 4 * n)
    assert policy.decide(n, 4, "float32", False).codec is None
    assert policy.crossover_bytes() == {"bf16": float("inf"), "int8": float("inf")}
    assert policy.decide(100, 4, "float32", False).codec is None  # latency-bound
    # Another size class is calibrated on its own calls, and predicted from its numbers.
    small = MIN_BYTES // 4
    assert policy.decide(small, 4, "float32", False).calibrating
    assert not policy.note_calibration(0.01, 4 * small)
    assert policy.note_calibration(0.01, 4 * small)
    policy.agree(np.array([8 / 1e9, ae, 2e-9, 2e-9, ab, 5e-9, 2e-9, ai]), 4 * small)
    assert not policy.decide(small, 4, "float32", False).calibrating
    assert policy.predicted["exact"] == pytest.approx(ae + 4 * small * 8 / 1e9)
    policy.decide(n, 4, "float32", False)  # the big class kept its own beta
    assert policy.predicted["exact"] == pytest.approx(ae + 4 * n / 20e9)
    assert AutoPolicy(4, "shm").decide(n, 4, "float32", False).codec is None
    assert AutoPolicy(1, "tcp").decide(n, 4, "float32", False).codec is None


def test_debug_explains_each_call(monkeypatch, capfd):
    monkeypatch.setenv("RINGREDUCE_DEBUG", "algorithm")
    with rr.init(rank=0, world_size=1) as comm:
        comm.all_reduce(np.ones(1000, np.float32), compression="auto")
        comm.all_reduce(np.ones(1000, np.float32), compression="int8")
    err = capfd.readouterr().err
    assert "compressed all_reduce #0 of 1000 float32 (sum): auto: exact: a world of one" in err
    assert "compressed all_reduce #1 of 1000 float32 (sum): int8 (asked for)" in err


def test_scratch_reuse_leaves_results_alone_and_kernels_match_python(group_factory):
    for got in group_factory(3).run(cr.reuse):
        assert got["first_kept"] and got["block_kept"] and got["same_paths"]
        assert got["inplace"].dtype == np.float16
        assert got["inplace"].tobytes() == got["copied"].tobytes()


def test_scratch_is_bounded():
    from ringreduce._comm.compressed.hop import Scratch

    scratch = Scratch()
    scratch.LIMIT = 1 << 20
    a = scratch.get("send", (2, 100_000))
    assert scratch.get("send", (2, 50_000)).base is a.base  # reused, not reallocated
    big = scratch.get("recv", 1 << 20)  # past the limit with "send": fresh, not kept
    assert scratch.nbytes() == 200_000 and big.base is None
    scratch.clear()
    assert scratch.nbytes() == 0
