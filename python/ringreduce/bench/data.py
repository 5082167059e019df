"""The reference data of ``ringreduce bench``: message sizes, iteration counts, the inputs
each rank sends and the exact result they must reduce to (the #wrong column).

Pure functions, unit-tested on their own.
"""

from __future__ import annotations

import re

import numpy as np

from .._arrays.bfloat16 import bfloat16

__all__ = [
    "bus_factor",
    "count_wrong",
    "default_iters",
    "default_warmup",
    "expected_output",
    "make_input",
    "parse_size",
    "resolve_dtype",
    "sweep_sizes",
    "DTYPES",
    "OPS",
]

OPS = ("sum", "prod", "min", "max", "avg")
_DTYPE_ALIASES = {
    "half": "float16",
    "fp16": "float16",
    "bf16": "bfloat16",
    "float": "float32",
    "fp32": "float32",
    "double": "float64",
    "fp64": "float64",
    "int": "int32",
    "char": "int8",
}
DTYPES = ("float16", "bfloat16", "float32", "float64", "int8", "uint8", "int32", "int64")
# Machine epsilon of the floating dtypes; "avg" divides by N, which need not be exact.
_EPS = {"float16": 2.0**-10, "bfloat16": 2.0**-7, "float32": 2.0**-23, "float64": 2.0**-52}
# Input values repeat with this period along the array and are shifted by the rank, so a
# block placed at the wrong offset or taken from the wrong rank shows up as #wrong.
_PERIOD = 7
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Parses a byte count such as ``8``, ``256K``, ``64M``, ``1G`` (powers of 1024)."""
    m = _SIZE_RE.match(str(text))
    if not m:
        raise ValueError(f"not a size: {text!r} (examples: 8, 256K, 64M, 1G)")
    scale = 1024 ** "bkmgt".index(m.group(2).lower() or "b")
    return int(float(m.group(1)) * scale)


def sweep_sizes(min_bytes: int, max_bytes: int, factor: int, itemsize: int) -> list[int]:
    """Message sizes from min_bytes to max_bytes multiplying by factor, like nccl-tests.

    Each size is rounded down to whole elements; sizes below one element are dropped.
    """
    if factor < 2:
        raise ValueError(f"step factor must be >= 2, got {factor}")
    sizes: list[int] = []
    size = max(min_bytes, 1)
    while size <= max_bytes:
        aligned = size - size % itemsize
        if aligned > 0 and (not sizes or aligned != sizes[-1]):
            sizes.append(aligned)
        size *= factor
    return sizes


def default_iters(size: int) -> int:
    """Timed iterations when -i is not given: 20 for small messages, down to 5 at 64 MB.

    Small messages are latency-bound and noisy, so they get many iterations; large ones
    are stable and expensive (a 64 MB call takes tenths of a second over loopback TCP on a
    small machine), so about 256 MiB per size is moved.
    """
    return int(min(20, max(5, (256 << 20) // max(size, 1))))


def default_warmup(size: int) -> int:
    """Warm-up iterations when -w is not given: 5 for small messages, 1 for large ones."""
    return int(min(5, max(1, (32 << 20) // max(size, 1))))


def bus_factor(world_size: int) -> float:
    """busbw / algbw for all_reduce: each rank sends 2(N-1)/N of the message."""
    return 2.0 * (world_size - 1) / world_size


def _pattern(op: str, rank: int) -> np.ndarray:
    """One period of a rank's input values, as float64 (exact small integers)."""
    k = (rank + np.arange(_PERIOD)) % _PERIOD
    if op == "prod":
        # Mostly ones, with a 2 from about one rank in seven: products stay exact powers
        # of two in every dtype for any practical rank count.
        return np.where(k == 0, 2.0, 1.0)
    return (k + 1).astype(np.float64)


def make_input(count: int, dtype: np.dtype, op: str, rank: int) -> np.ndarray:
    """This rank's input: small integers, exactly representable in every dtype."""
    return np.resize(_pattern(op, rank).astype(dtype), count)


def expected_output(count: int, dtype: np.dtype, op: str, world_size: int) -> np.ndarray:
    """The exact all_reduce result of make_input over world_size ranks."""
    table = np.stack([_pattern(op, r) for r in range(world_size)])
    if np.dtype(dtype).kind in "iu":
        # Integer sums and products wrap modulo 2**bits, in any order of reduction.
        reduced = _reduce_table(table.astype(np.int64), op).astype(dtype)
    else:
        reduced = _reduce_table(table, op).astype(dtype)
    return np.resize(reduced, count)


def _reduce_table(table: np.ndarray, op: str) -> np.ndarray:
    if op == "sum":
        return table.sum(axis=0)
    if op == "prod":
        return table.prod(axis=0)
    if op == "min":
        return table.min(axis=0)
    if op == "max":
        return table.max(axis=0)
    if op == "avg":
        return table.sum(axis=0) / table.shape[0]
    raise ValueError(f"unknown op {op!r}")


def count_wrong(result: np.ndarray, expected: np.ndarray, op: str) -> int:
    """Elements of result that differ from expected.

    Exact (0 ULP) except for "avg" on floating dtypes, which may be off by up to 2 ULP
    because dividing by N can round (the nccl-tests tolerance for AVG).
    """
    if op == "avg" and result.dtype.name in _EPS:
        tol = 2 * _EPS[result.dtype.name] * np.abs(expected.astype(np.float64))
        diff = np.abs(result.astype(np.float64) - expected.astype(np.float64))
        return int(np.count_nonzero(~(diff <= tol)))
    return int(np.count_nonzero(result != expected))


def resolve_dtype(name: str) -> np.dtype:
    """numpy dtype for a -d value; bfloat16 comes from ml_dtypes."""
    name = _DTYPE_ALIASES.get(name.lower(), name.lower())
    if name not in DTYPES:
        raise ValueError(f"unsupported dtype {name!r} (choose from {', '.join(DTYPES)})")
    if name == "bfloat16":
        try:
            return bfloat16("-d bfloat16")
        except ImportError as exc:
            raise ValueError(str(exc)) from None
    return np.dtype(name)
