"""The per-element functors of csrc/reduce/ops.h and half.h, checked on the CPU.

The CUDA kernels run these same functions, so these tests cover their
arithmetic on machines without a GPU. Every result is compared bit for bit
(any NaN matching any NaN) with numpy or ml_dtypes computing in the kernel's
compute type, into poisoned output buffers with a guard past the end.

The 16-bit conversions are reached through the kernels: the load (16-bit to
float32) through exact operations on every one of the 65536 bit patterns, the
store (float32 to 16-bit) through results that must be rounded: ties, values
past the largest finite, subnormals, and quotients with all mantissa bits set.
"""

from __future__ import annotations

import numpy as np
import pytest
from _kernels import (
    DTYPE_CODES,
    FLOATS,
    INTEGERS,
    OP_CODES,
    POISON,
    describe,
    divide_reference,
    guard_intact,
    mismatches,
    per_hop_reference,
    poisoned,
    random_operands,
    reduce_all_reference,
    reduce_cpu,
    reference,
    run,
)

from ringreduce import _core

from _data import DTYPES, OPS, np_dtype

pytest.importorskip("ml_dtypes", reason="needs ml_dtypes: pip install -e '.[test]' brings it")

SIZES = [0, 1, 7, 8, 9, 33, 4099]
HALVES = ("float16", "bfloat16")
MANTISSA_BITS = {"float16": 10, "bfloat16": 7}
MIN_NORMAL = {"float16": 2.0**-14, "bfloat16": 2.0**-126}


def all_bit_patterns(dtype: str) -> np.ndarray:
    return np.arange(65536, dtype=np.uint16).view(np_dtype(dtype))


def check(dtype: str, op: str, a: np.ndarray, b: np.ndarray) -> None:
    got = run(dtype, op, a, b)
    want = reference(dtype, op, a, b)
    zeros = op not in ("min", "max")
    bad = mismatches(got, want, signed_zeros=zeros)
    assert bad.size == 0, f"{dtype} {op}: " + describe(got, want, a, b, zeros)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_dtype_and_op_matches_numpy(dtype, op):
    for i, count in enumerate(SIZES):
        a = random_operands(dtype, count, seed=2 * i)
        b = random_operands(dtype, count, seed=2 * i + 1)
        check(dtype, op, a, b)
        # Operands that start one element into their allocation.
        a1 = np.concatenate([a[:1], a])[1:]
        b1 = np.concatenate([b[:1], b])[1:]
        check(dtype, op, a1, b1)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_in_place(dtype, op):
    count = 1031
    a = random_operands(dtype, count, seed=10)
    b = random_operands(dtype, count, seed=11)
    want = reference(dtype, op, a, b)
    kernel = reduce_cpu(dtype, op)
    zeros = op not in ("min", "max")
    into_a, into_b = a.copy(), b.copy()
    kernel(into_a.ctypes.data, into_a.ctypes.data, b.ctypes.data, count)
    kernel(into_b.ctypes.data, a.ctypes.data, into_b.ctypes.data, count)
    assert mismatches(into_a, want, zeros).size == 0, "out is a: " + describe(into_a, want, a, b)
    assert mismatches(into_b, want, zeros).size == 0, "out is b: " + describe(into_b, want, a, b)


# ---- 16-bit floats: every bit pattern -------------------------------------


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize(
    "op, partner",
    [
        ("max", None),  # max(h, h) = store(load(h)): the round trip
        ("sum", None),  # 2h: exact in float32, overflows to inf at the top
        ("prod", None),  # h*h: exact in float32 (at most 22 significant bits)
        ("prod", 0.5),  # halves subnormals: ties in the subnormal range
        ("prod", 3.0),
        ("sum", 1.0),
    ],
)
def test_16bit_every_bit_pattern(dtype, op, partner):
    a = all_bit_patterns(dtype)
    b = a if partner is None else np.full(a.size, partner, dtype=a.dtype)
    check(dtype, op, a, b)


@pytest.mark.parametrize("divisor", [1, 2, 3, 4, 7, 10])
@pytest.mark.parametrize("dtype", HALVES)
def test_16bit_divide_every_bit_pattern(dtype, divisor):
    # Quotients by 3, 7, 10 fill every float32 mantissa bit: generic rounding. Powers
    # of two are multiplied by their inverse: the same bits, subnormals included.
    x = all_bit_patterns(dtype)
    got = x.copy()
    _core.testing.divide_local(DTYPE_CODES[dtype], got.ctypes.data, got.size, divisor)
    want = divide_reference(dtype, x, divisor)
    assert mismatches(got, want).size == 0, describe(got, want, x, x)


@pytest.mark.parametrize("dtype", HALVES)
def test_16bit_ties_round_to_even(dtype):
    # a + half an ulp of a is exactly halfway between two 16-bit values, for
    # every finite normal a whose half ulp is itself representable.
    a = all_bit_patterns(dtype)
    a32 = a.astype(np.float32)
    normal = np.isfinite(a32) & (np.abs(a32) >= MIN_NORMAL[dtype])
    a, a32 = a[normal], a32[normal]
    _, exponent = np.frexp(a32)
    half_ulp = np.ldexp(np.sign(a32), exponent - MANTISSA_BITS[dtype] - 2).astype(np.float32)
    b = half_ulp.astype(a.dtype)
    exact = (b.astype(np.float32) == half_ulp) & (half_ulp != 0)
    assert exact.sum() > 50000
    check(dtype, "sum", a[exact], b[exact])


@pytest.mark.parametrize("op", ["sum", "prod"])
@pytest.mark.parametrize("dtype", HALVES)
def test_16bit_random_bit_pattern_pairs(dtype, op):
    rng = np.random.default_rng(7)
    a, b = (rng.integers(0, 1 << 16, size=1 << 20, dtype=np.uint16) for _ in "ab")
    a, b = a.view(np_dtype(dtype)), b.view(np_dtype(dtype))
    check(dtype, op, a, b)


@pytest.mark.parametrize(
    "dtype, op, a, b, want",
    [
        ("float16", "sum", 65504.0, 16.0, np.inf),  # the tie above the largest finite: inf
        ("float16", "sum", 65504.0, 8.0, 65504.0),
        ("float16", "sum", -65504.0, -16.0, -np.inf),
        ("float16", "sum", 2048.0, 1.0, 2048.0),  # tie, to the even mantissa below
        ("float16", "sum", 2050.0, 1.0, 2052.0),  # tie, to the even mantissa above
        ("float16", "sum", 2.0**-14, -(2.0**-24), 2.0**-14 - 2.0**-24),  # largest subnormal
        ("float16", "prod", 2.0**-24, 0.5, 0.0),  # subnormal tie, to even (zero)
        ("float16", "prod", 3 * 2.0**-24, 0.5, 2.0**-23),  # subnormal tie, to even (up)
        ("bfloat16", "sum", 256.0, 1.0, 256.0),
        ("bfloat16", "sum", 258.0, 1.0, 260.0),
        ("bfloat16", "sum", 3.3895313892515355e38, 2.0**119, np.inf),
    ],
)
def test_16bit_known_values(dtype, op, a, b, want):
    # Spelled out, so that numpy and ml_dtypes are not the only witnesses.
    dt = np_dtype(dtype)
    got = run(dtype, op, np.array([a], dtype=dt), np.array([b], dtype=dt))
    assert got.astype(np.float64)[0] == want


@pytest.mark.parametrize("dtype", HALVES)
def test_16bit_nan_results_are_quiet_nans(dtype):
    dt = np_dtype(dtype)
    signaling = np.array([0x7C01 if dtype == "float16" else 0x7F81], dtype=np.uint16).view(dt)
    a = np.array([np.nan, np.inf, 0.0, signaling[0]], dtype=dt)
    b = np.array([1.0, -np.inf, np.nan, 1.0], dtype=dt)
    got = run(dtype, "sum", a, b)
    assert np.isnan(got.astype(np.float32)).all()
    quiet_bit = 0x0200 if dtype == "float16" else 0x0040
    assert (got.view(np.uint16) & quiet_bit).all()


# ---- integers and min/max ---------------------------------------------------


@pytest.mark.parametrize("op", ["sum", "prod"])
@pytest.mark.parametrize("dtype", INTEGERS)
def test_integer_wrap_around_like_numpy(dtype, op):
    info = np.iinfo(np_dtype(dtype))
    hi, lo = int(info.max), int(info.min)
    half = 1 << (info.bits // 2)
    pairs = [(hi, 1), (lo, -1), (hi, hi), (lo, lo), (half, half), (hi // 3, 7), (lo, hi)]
    if lo == 0:
        pairs = [(x, y % (hi + 1)) for x, y in pairs]
    a = np.array([x for x, _ in pairs], dtype=np_dtype(dtype))
    b = np.array([y for _, y in pairs], dtype=np_dtype(dtype))
    check(dtype, op, a, b)
    # Spelled out, so that numpy's own wrap-around is not the only witness.
    if op == "sum":
        assert int(run(dtype, op, a[:1], b[:1])[0]) == lo
    else:
        assert int(run(dtype, op, a[4:5], b[4:5])[0]) == 0


@pytest.mark.parametrize("op", ["min", "max"])
@pytest.mark.parametrize("dtype", FLOATS)
def test_min_max_propagate_nan_like_numpy(dtype, op):
    nan, inf = np.nan, np.inf
    a = np.array([nan, 1.0, nan, -inf, inf, 0.0, -0.0, nan], dtype=np_dtype(dtype))
    b = np.array([1.0, nan, nan, nan, nan, -0.0, 0.0, -inf], dtype=np_dtype(dtype))
    check(dtype, op, a, b)
    got = run(dtype, op, a, b).astype(np.float64)
    either_nan = np.isnan(a.astype(np.float64)) | np.isnan(b.astype(np.float64))
    assert np.array_equal(np.isnan(got), either_nan)


# ---- avg: the division after the sum ---------------------------------------


@pytest.mark.parametrize("divisor", [1, 2, 3, 7, 8, 1000])
@pytest.mark.parametrize("dtype", FLOATS)
def test_divide_matches_numpy(dtype, divisor):
    for count in SIZES:
        x = random_operands(dtype, count, seed=count)
        got = x.copy()
        _core.testing.divide_local(DTYPE_CODES[dtype], got.ctypes.data, count, divisor)
        want = divide_reference(dtype, x, divisor)
        assert mismatches(got, want).size == 0, describe(got, want, x, x)


@pytest.mark.parametrize("divisor", [2, 3, 4, 7, 8, 1024])
@pytest.mark.parametrize("dtype", FLOATS)
def test_fused_sum_then_divide_has_the_bits_of_the_two_passes(dtype, divisor):
    """avg's last reduce-scatter step reduces and divides each segment in one pass: the
    same bits as the sum kernel and then the division (overflowing sums, subnormal
    quotients, infinities and NaN among the operands). 16-bit floats have no fused
    kernel and say so."""
    code = DTYPE_CODES[dtype]
    for count in SIZES:
        a = random_operands(dtype, count, seed=count)
        b = random_operands(dtype, count, seed=count + 1)
        want = run(dtype, "sum", a, b)
        _core.testing.divide_local(code, want.ctypes.data, count, divisor)
        raw = poisoned(dtype, count)
        fused = _core.testing.sum_divide_local(
            code, raw.ctypes.data, a.ctypes.data, b.ctypes.data, count, divisor
        )
        if dtype in HALVES:
            assert fused is False and (raw == POISON).all()
            continue
        assert fused is True and guard_intact(raw), f"{dtype}: wrote past element {count}"
        got = raw[: count * a.itemsize].view(a.dtype)
        assert mismatches(got, want).size == 0, describe(got, want, a, b)
        # In place, as the ring reduces: out is the partial sum it adds to.
        inplace = a.copy()
        p = inplace.ctypes.data
        assert _core.testing.sum_divide_local(code, p, p, b.ctypes.data, count, divisor)
        assert mismatches(inplace, want).size == 0, describe(inplace, want, a, b)


def reduce_all(dtype: str, op: str, inputs: list, divisor: int = 0) -> np.ndarray:
    """reduce_all_local into a fresh poisoned buffer; checks that nothing past n was written."""
    n = inputs[0].size
    raw = poisoned(dtype, n)
    addresses = [x.ctypes.data for x in inputs]
    _core.testing.reduce_all_local(
        DTYPE_CODES[dtype], OP_CODES[op], addresses, raw.ctypes.data, n, divisor
    )
    assert guard_intact(raw), f"{dtype} {op} wrote past element {n}"
    return raw[: n * inputs[0].itemsize].view(inputs[0].dtype).copy()


@pytest.mark.parametrize(
    "dtype,op", [(d, o) for d in DTYPES for o in OPS if o != "avg" or d in FLOATS]
)
def test_reduce_all_accumulates_in_the_compute_type_in_rank_order(dtype, op):
    """The window paths' one-pass reduction of every rank's input: 1, 2, 3, 5 and 16
    inputs over sizes across its 1024-element blocks, special values mixed in, against
    numpy accumulating in float32 (16-bit floats) or the dtype, rounded once; then in
    place (the output one of the inputs, as a window rank's own buffer is)."""
    for count in (1, 2, 3, 5, 16):
        divisor = count if op == "avg" else 0
        for n in (0, 1, 9, 1023, 1024, 1025, 4099):
            inputs = [
                random_operands(dtype, n, seed=1000 * count + 10 * n + r) for r in range(count)
            ]
            want = reduce_all_reference(dtype, op, inputs, divisor)
            got = reduce_all(dtype, op, inputs, divisor)
            zeros = op not in ("min", "max")
            bad = mismatches(got, want, signed_zeros=zeros)
            assert bad.size == 0, f"{count} inputs, n={n}: {bad.size} wrong, first at {bad[:3]}"
            if n == 0:
                continue
            for alias in {0, count - 1}:
                copies = [x.copy() for x in inputs]
                out = copies[alias]
                _core.testing.reduce_all_local(
                    DTYPE_CODES[dtype],
                    OP_CODES[op],
                    [x.ctypes.data for x in copies],
                    out.ctypes.data,
                    n,
                    divisor,
                )
                bad = mismatches(out, want, signed_zeros=zeros)
                assert bad.size == 0, f"in place on input {alias} of {count}: {bad.size} wrong"


@pytest.mark.parametrize("dtype", HALVES)
def test_reduce_all_rounds_16_bit_floats_once(dtype):
    """Eight ranks' 16-bit gradients: the one-pass sum is float32's, rounded once, and
    not what rounding after every addition gives (the data are chosen so the two differ
    at many elements, so this test can tell them apart)."""
    rng = np.random.default_rng(7)
    inputs = [rng.standard_normal(4096).astype(np_dtype(dtype)) for _ in range(8)]
    got = reduce_all(dtype, "sum", inputs)
    assert mismatches(got, reduce_all_reference(dtype, "sum", inputs)).size == 0
    assert mismatches(got, per_hop_reference(dtype, "sum", inputs)).size > 100
