"""The C++ codec kernels (csrc/kernels/codec.h) against the numpy reference in
compression/codecs.py: the same payload bytes and the same decoded bits for every codec
x size (empty, one value, around a block, a large prime) x kind of data (Gaussian,
mixed magnitudes, inf/nan with payloads, huge, tiny, subnormals, signed zeros), and the
error each codec states, checked against float64 on the kernels' output."""

from __future__ import annotations

import re

import numpy as np
import pytest

from ringreduce import _core
from ringreduce.compression import BLOCK, get_codec
from ringreduce.compression import codecs as C

CODECS = ("bf16", "fp16", "int8", "int4")
SIZES = (0, 1, 511, 512, 513, 100003)
KINDS = ("gaussian", "magnitudes", "specials", "huge", "tiny", "subnormal", "zeros")
SEED = (0x52494E47 << 96) | (7 << 40) | (1 << 32) | (3 << 16) | 2  # a collective's seed


def _bits(*words):
    return np.array(words, np.uint32).view(np.float32)


def data(kind: str, n: int) -> np.ndarray:
    """float32 test values of one kind, a function of (kind, n) alone."""
    rng = np.random.default_rng([n, KINDS.index(kind)])
    g = rng.standard_normal(n).astype(np.float32)
    if kind == "gaussian":
        return g
    if kind == "magnitudes":  # every block a different scale, from 2**-120 to 2**120
        return (g * np.exp2(rng.integers(-120, 121, size=n))).astype(np.float32)
    if kind == "specials":  # inf, -inf and nans (quiet, signalling, with payloads, signed)
        x = g.copy()
        odd = _bits(
            0x7F800000,
            0xFF800000,
            0x7FC00000,
            0xFFC00000,
            0x7F800001,
            0x7FA00000,
            0xFFBFFFFF,
            0x7FC02001,
            0x80000000,
            0x00000001,
        )
        where = rng.choice(n, size=min(n, 3 + n // 97), replace=False)
        x[where] = odd[np.arange(where.size) % odd.size]
        return x
    if kind == "huge":  # near float32's largest: scales and casts must not overflow
        x = (np.sign(g) * np.float32(3.4e38) * rng.uniform(0.5, 1, n)).astype(np.float32)
        x[: min(n, 2)] = np.float32(3.4028235e38)  # the largest float32, which bf16 rounds up
        return x
    if kind == "tiny":  # normal, but levels / largest overflows without the lift
        return (g * np.float32(1e-38)).astype(np.float32)
    if kind == "subnormal":
        return (g * np.float32(1e-42)).astype(np.float32)
    x = np.zeros(n, np.float32)  # zeros: +0 and -0 blocks
    x[: n // 2] = -0.0
    return x


def _same_bits(a: np.ndarray, b: np.ndarray, what: str) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape, what
    assert a.tobytes() == b.tobytes(), (
        what,
        int(np.argmax(a.view(np.uint8) != b.view(np.uint8))) if a.size else None,
    )


ISAS = _core.codec_kernel_isas()


def test_the_kernels_are_built():
    assert hasattr(_core, "codec_encode") and C.use_kernels()
    assert ISAS[-1] == "generic" and set(ISAS) <= {"avx512", "avx2", "generic"}
    assert _core.codec_kernel_isa() == ISAS[0]  # the best this machine runs


def test_a_kernel_variant_is_chosen_by_name_and_an_unknown_one_refused():
    try:
        for isa in reversed(ISAS):
            _core.use_codec_kernel_isa(isa)
            assert _core.codec_kernel_isa() == isa
        runnable = ", ".join(f"'{isa}'" for isa in ISAS)
        said = f"no variant 'sse9' runs on this machine; these do: {runnable}"
        with pytest.raises(ValueError, match=re.escape(said)):
            _core.use_codec_kernel_isa("sse9")
        assert _core.codec_kernel_isa() == ISAS[0]  # the refusal left the last choice
    finally:
        _core.use_codec_kernel_isa(ISAS[0])


@pytest.fixture(params=ISAS)
def isa(request):
    """Runs the test with each kernel variant this machine runs (they must give the same
    bits), then gives the process back its best."""
    _core.use_codec_kernel_isa(request.param)
    yield request.param
    _core.use_codec_kernel_isa(ISAS[0])


@pytest.mark.parametrize("name", CODECS)
@pytest.mark.parametrize("kind", KINDS)
def test_kernels_give_numpys_bits(name, kind, isa):
    codec = get_codec(name)
    for n in SIZES:
        x = data(kind, n)
        payload = codec.encode(x, SEED)
        _same_bits(payload, codec.encode(x, SEED, use_numpy=True), f"{name} {kind} {n} encode")
        assert payload.size == codec.payload_bytes(n) == _core.codec_payload_bytes(name, n)
        y = codec.decode(payload, n)
        _same_bits(y, codec.decode(payload, n, use_numpy=True), f"{name} {kind} {n} decode")

        # The owner's sum: its own values plus three peers' payloads, in order.
        with np.errstate(invalid="ignore", over="ignore"):  # inf - inf, huge + huge
            others = [codec.encode(data(kind, n) * np.float32(k + 2), SEED + k) for k in range(3)]
            acc, ref = x.copy(), x.copy()
            codec.decode_add(others, n, acc)
            codec.decode_add(others, n, ref, use_numpy=True)
        _same_bits(acc, ref, f"{name} {kind} {n} decode_add")

        # Error feedback's encode: payload and new residual.
        r = (data("gaussian", n) * np.float32(1e-3)).astype(np.float32)
        r_np = r.copy()
        with np.errstate(invalid="ignore", over="ignore"):
            p = codec.encode_feedback(x, r, SEED)
            p_np = codec.encode_feedback(x, r_np, SEED, use_numpy=True)
        _same_bits(p, p_np, f"{name} {kind} {n} encode_feedback payload")
        _same_bits(r, r_np, f"{name} {kind} {n} encode_feedback residual")


def _block_max(x: np.ndarray) -> np.ndarray:
    """Each value's block's largest finite |value| (float64)."""
    a = np.where(np.isfinite(x), np.abs(x.astype(np.float64)), 0.0)
    pad = np.zeros(-(-x.size // BLOCK) * BLOCK)
    pad[: x.size] = a
    return np.repeat(pad.reshape(-1, BLOCK).max(axis=1), BLOCK)[: x.size]


def _bound(name: str, x: np.ndarray) -> np.ndarray:
    """The largest error decode(encode(x)) may make per value: docs/compression.md's
    per-codec bound, plus what float32's subnormal range adds (bf16 and fp16: half of
    its smallest step; int: the scale's own rounding, at most qmax * 2**-150)."""
    mags, top = np.abs(x.astype(np.float64)), _block_max(x)
    if name == "bf16":
        return mags * 2.0**-8 + 2.0**-134
    if name == "fp16":
        return mags * 2.0**-11 + top * 2.0**-39 + 2.0**-150
    qmax = 127 if name == "int8" else 7
    # A block holding inf or nan uses qmax - 1 levels.
    return top / (qmax - 1) * (1 + 2.0**-20) + qmax * 2.0**-150


@pytest.mark.parametrize("name", CODECS)
@pytest.mark.parametrize("kind", KINDS)
def test_decode_of_encode_within_the_stated_bound(name, kind):
    codec = get_codec(name)
    x = data(kind, 100003)
    y = codec.decode(codec.encode(x, SEED), x.size)
    finite = np.isfinite(x)
    # Within one of its steps of float32's largest, a codec may round up past it, to
    # inf (the codecs' docstrings say so): checked as such.
    with np.errstate(invalid="ignore"):  # float64 of a signalling nan warns
        bound = _bound(name, x)
        over = finite & (np.abs(x.astype(np.float64)) + bound >= np.finfo(np.float32).max)
        near = np.abs(y[over].astype(np.float64) - x[over]) <= bound[over]
        assert (np.isinf(y[over]) | near).all()
        finite &= ~over
        err = np.abs(y[finite].astype(np.float64) - x[finite])
        bound = bound[finite]
    assert (err <= bound).all(), (name, kind, float((err - bound).max()))
    # Non-finite values come back as they were: inf as inf, nan as a nan.
    np.testing.assert_array_equal(y[np.isinf(x)], x[np.isinf(x)])
    assert np.isnan(y[np.isnan(x)]).all()


def test_stochastic_rounding_is_unbiased_and_seeded():
    """int4 of one value between two levels, over many seeds: the mean converges to the
    value (error ~ step / sqrt(K)), same seed same bytes, other seeds other bytes."""
    codec = get_codec("int4")
    x = np.full(4096, 0.3, np.float32)
    x[::BLOCK] = 1.0  # each block's largest: step 1/7, 0.3 lies between levels 2 and 3
    decoded = np.stack([codec.decode(codec.encode(x, s), x.size) for s in range(200)])
    rest = np.ones(x.size, bool)
    rest[::BLOCK] = False
    assert abs(decoded[:, rest].mean() - 0.3) < 1e-3
    assert set(np.unique(np.round(decoded[:, rest] * 7))) == {2.0, 3.0}
    assert codec.encode(x, 5).tobytes() == codec.encode(x, 5).tobytes()
    assert codec.encode(x, 5).tobytes() != codec.encode(x, 6).tobytes()


def test_dither_is_uniform_and_independent_across_keys():
    keys = [C.seed_key(s) for s in (0, 1, SEED, SEED + (1 << 16))]
    assert len(set(keys)) == 4 and all(0 <= k < 1 << 64 for k in keys)
    draws = [C.dither(k, 0, 1 << 16) for k in keys]
    for u in draws:
        assert u.dtype == np.float32 and u.min() >= 0 and u.max() < 1
        counts = np.bincount((u * 16).astype(int), minlength=16)
        assert np.abs(counts - 4096).max() < 5 * 64  # 5 sigma of a binomial
    for a in range(4):
        for b in range(a + 1, 4):
            assert abs(np.corrcoef(draws[a], draws[b])[0, 1]) < 0.03
    # A window is the same draws wherever it starts, across a 2**32 boundary too.
    k = keys[2]
    np.testing.assert_array_equal(C.dither(k, 10, 5), C.dither(k, 0, 15)[10:])
    np.testing.assert_array_equal(
        C.dither(k, (1 << 32) - 3, 6),
        np.concatenate([C.dither(k, (1 << 32) - 3, 3), C.dither(k, 1 << 32, 3)]),
    )
    with pytest.raises(ValueError, match="seed"):
        C.seed_key(-1)


def test_kernels_refuse_wrong_buffers():
    x = np.ones(1000, np.float32)
    with pytest.raises(ValueError, match="x: expected float32"):
        _core.codec_encode("int8", x.astype(np.float64), 1, np.empty(2000, np.uint8))
    with pytest.raises(ValueError, match="payload: needs 1008"):
        _core.codec_encode("int8", x, 1, np.empty(1000, np.uint8))
    out = np.empty(1000, np.float32)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        _core.codec_decode("int8", np.zeros(1008, np.uint8), 1000, out)
    with pytest.raises(ValueError, match="C-contiguous"):
        _core.codec_decode("int8", np.zeros(2016, np.uint8)[::2], 1000, np.empty(1000, np.float32))
    with pytest.raises(ValueError, match="'int3'.*'int4'"):
        _core.codec_payload_bytes("int3", 10)


def test_use_kernels_switches_to_numpy_and_back(monkeypatch):
    codec = get_codec("int8")
    x = data("gaussian", 2000)
    want = codec.encode(x, 9)
    try:
        assert C.use_kernels(False) is False

        def refuse(*args, **kwargs):
            raise AssertionError("the kernels ran after use_kernels(False)")

        monkeypatch.setattr(_core, "codec_encode", refuse)
        assert codec.encode(x, 9).tobytes() == want.tobytes()
    finally:
        monkeypatch.undo()
        assert C.use_kernels(True) is True
