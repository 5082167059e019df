"""Runs the reduction kernels on raw buffers and builds their numpy references.

The CPU kernels are the shared functors of csrc/reduce/ops.h in a loop, so what
these helpers check on the CPU is the arithmetic the CUDA kernels run too.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from ringreduce import _core

from _data import combine, np_dtype

# The engine's own numbering, from the extension.
DTYPE_CODES = {name: int(code) for name, code in _core.DType.__members__.items()}
OP_CODES = {name.lower(): int(code) for name, code in _core.Op.__members__.items()}
FLOATS = ("float16", "bfloat16", "float32", "float64")
INTEGERS = ("int8", "uint8", "int32", "int64")

# Bytes past the end of every output; a kernel that writes them has overrun.
GUARD = 64
POISON = 0xA5

# out, a, b, n -> None
RawReduce = Callable[[int, int, int, int], None]


def poisoned(dtype: str, count: int) -> np.ndarray:
    """A buffer of count elements plus a guard, every byte set to POISON."""
    return np.full(count * np_dtype(dtype).itemsize + GUARD, POISON, dtype=np.uint8)


def guard_intact(raw: np.ndarray) -> bool:
    return bool((raw[-GUARD:] == POISON).all())


def reduce_cpu(dtype: str, op: str) -> RawReduce:
    """out, a, b, n -> out = a op b with the CPU kernels."""
    d, o = DTYPE_CODES[dtype], OP_CODES[op]
    return lambda out, a, b, n: _core.testing.reduce_local(d, o, out, a, b, n)


def run(
    dtype: str, op: str, a: np.ndarray, b: np.ndarray, kernel: Optional[RawReduce] = None
) -> np.ndarray:
    """out = a op b into a fresh poisoned buffer; checks that nothing past n was written."""
    kernel = kernel or reduce_cpu(dtype, op)
    assert a.dtype == np_dtype(dtype) and b.dtype == a.dtype and a.shape == b.shape
    n = a.size
    raw = poisoned(dtype, n)
    kernel(raw.ctypes.data, a.ctypes.data, b.ctypes.data, n)
    assert guard_intact(raw), f"{dtype} {op} wrote past element {n}"
    return raw[: n * a.itemsize].view(a.dtype).copy()


def compute_dtype(dtype: str) -> np.dtype:
    """The dtype a reference computes in so that its result rounds like the kernel's.

    16-bit floats are computed in float32 by the kernels. float32 is computed in
    float64 by the reference: one +, *, / in float64 rounded to float32 is the
    correctly rounded float32 result, so that reference is exact.
    """
    if dtype in ("float16", "bfloat16"):
        return np.dtype(np.float32)
    if dtype in ("float32", "float64"):
        return np.dtype(np.float64)
    return np_dtype(dtype)


def reference(dtype: str, op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """numpy's a op b in the kernel's compute type, rounded to dtype; integers wrap."""
    cd = compute_dtype(dtype)
    x, y = a.astype(cd), b.astype(cd)
    with np.errstate(all="ignore"):
        return combine(op, x, y).astype(np_dtype(dtype))


def reduce_all_reference(
    dtype: str, op: str, inputs: list[np.ndarray], divisor: int = 0
) -> np.ndarray:
    """inputs[0] op ... op inputs[-1] in rank order as the window paths compute it: in
    float32 for the 16-bit floats (each step rounded to float32, the result rounded to
    the dtype once), in the dtype itself for the others; then / divisor when > 0."""
    cd = np.dtype(np.float32) if dtype in ("float16", "bfloat16") else np_dtype(dtype)
    with np.errstate(all="ignore"):
        acc = inputs[0].astype(cd)
        for x in inputs[1:]:
            acc = combine(op, acc, x.astype(cd))
        if divisor > 0:
            acc = acc / cd.type(divisor)
        return acc.astype(np_dtype(dtype))


def per_hop_reference(dtype: str, op: str, inputs: list[np.ndarray]) -> np.ndarray:
    """The same reduction rounded to the dtype after every step, as a ring's hops round."""
    acc = inputs[0]
    for x in inputs[1:]:
        acc = reference(dtype, op, acc, x)
    return acc


def half_window_cases(n: int, count: int):
    """(dtype, op, every rank's input, the result) for the window paths' 16-bit checks:
    random gradients of n ranks, summed and averaged in one pass (reduce_all_reference),
    and whether that result differs from rounding at every hop (it does somewhere for
    n >= 3, so a check against it can tell the two apart)."""
    cases = []
    for dtype in ("float16", "bfloat16"):
        inputs = [
            np.random.default_rng(17 * r + 1).standard_normal(count).astype(np_dtype(dtype))
            for r in range(n)
        ]
        for op in ("sum", "avg"):
            want = reduce_all_reference(dtype, op, inputs, n if op == "avg" else 0)
            hops = per_hop_reference(dtype, "sum", inputs)
            if op == "avg":
                hops = divide_reference(dtype, hops, n)
            cases.append((dtype, op, inputs, want, mismatches(want, hops).size > 0))
    return cases


def divide_reference(dtype: str, x: np.ndarray, divisor: int) -> np.ndarray:
    """numpy's x / divisor in the kernel's compute type, rounded to dtype."""
    cd = compute_dtype(dtype)
    with np.errstate(all="ignore"):
        return (x.astype(cd) / cd.type(divisor)).astype(np_dtype(dtype))


def mismatches(got: np.ndarray, want: np.ndarray, signed_zeros: bool = True) -> np.ndarray:
    """Indices where got and want differ in bits; any NaN matches any NaN.

    With signed_zeros=False, +0 and -0 match too: IEEE leaves the sign of
    min(+0, -0) and max(+0, -0) open, and numpy's answer depends on its SIMD
    code path, while the kernels return the first operand.
    """
    assert got.dtype == want.dtype and got.shape == want.shape
    bits = np.dtype(f"u{got.itemsize}")
    differ = got.view(bits) != want.view(bits)
    if got.dtype.kind == "f" or got.dtype == np_dtype("bfloat16"):
        g, w = got.astype(np.float64), want.astype(np.float64)
        differ &= ~(np.isnan(g) & np.isnan(w))
        if not signed_zeros:
            differ &= ~((g == 0) & (w == 0))
    return np.flatnonzero(differ)


def describe(
    got: np.ndarray, want: np.ndarray, a: np.ndarray, b: np.ndarray, signed_zeros: bool = True
) -> str:
    """The first few mismatches, for assertion messages."""
    bad = mismatches(got, want, signed_zeros)
    rows = [f"[{i}] {a[i]!r} op {b[i]!r} -> {got[i]!r}, want {want[i]!r}" for i in bad[:5]]
    return f"{bad.size} of {got.size} wrong: " + "; ".join(rows)


def random_operands(dtype: str, count: int, seed: int) -> np.ndarray:
    """Random values spanning the dtype, with its special values mixed in."""
    rng = np.random.default_rng(seed)
    dt = np_dtype(dtype)
    if dtype in INTEGERS:
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, size=count, endpoint=True, dtype=dt)
    # Mix normal-scale data with values near the dtype's overflow and underflow.
    finfo_max = {"float16": 6e4, "bfloat16": 3e38, "float32": 3e38, "float64": 1e308}[dtype]
    tiny = {"float16": 6e-8, "bfloat16": 1e-39, "float32": 1e-45, "float64": 5e-324}[dtype]
    scale = rng.choice([1.0, 1e3, finfo_max, tiny * 16, 1e-3], size=count)
    with np.errstate(all="ignore"):
        x = (rng.standard_normal(count) * scale).astype(dt)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0]).astype(dt)
    where = rng.random(count) < 0.05
    x[where] = rng.choice(specials, size=int(where.sum()))
    return x


def codec_values(n: int, seed: int) -> np.ndarray:
    """float32 values for the codec kernels: Gaussian, with a block of zeros, a block
    below 2**-100 (lifted before scaling) and a block holding inf, -inf and nan, where n
    reaches them (blocks of 512 values)."""
    x = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    x[512:1024] = 0.0
    x[1024:1536] *= np.float32(2.0**-110)
    if n > 1600:
        x[1600], x[1601], x[1602] = np.inf, -np.inf, np.nan
    return x
