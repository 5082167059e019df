"""Test data whose reductions are exact, computed from rank and size alone."""

from __future__ import annotations

import numpy as np

try:
    import ml_dtypes

    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes is a test dependency
    BF16 = None

DTYPES = ["float16", "bfloat16", "float32", "float64", "int8", "uint8", "int32", "int64"]
OPS = ["sum", "prod", "min", "max", "avg"]
FLOATING = {"float16", "bfloat16", "float32", "float64"}


# The transport that runs the whole arithmetic matrix (every dtype x op x size x world
# size); the others carry opaque segments and run its contract subset: one dtype of each
# element width (what changes how many bytes a segment or slot holds) at every world
# size but one.
MATRIX_LINKS = "shm"
OTHER_LINKS = ("tcp", "shm+tcp")


# World sizes of the contract subset on OTHER_LINKS: a pair, and a ring whose left and
# right neighbours differ. Larger worlds there are in the extended run (--extended).
CONTRACT_SIZES = (2, 3)


def extended(*values):
    """A parametrize case that runs only with --extended (see conftest.py): the cross
    product beyond the default run's contract subset."""
    import pytest

    return pytest.param(*values, marks=pytest.mark.extended)


def links_and_sizes(world_sizes: list, contract=CONTRACT_SIZES) -> list:
    """(links, n) for pytest.mark.parametrize("links,n", ...): every world size on
    MATRIX_LINKS; on the other transports the sizes in `contract` by default, the rest
    in the extended run."""
    cases = [(MATRIX_LINKS, n) for n in world_sizes]
    cases += [
        (links, n) if n in contract else extended(links, n)
        for links in OTHER_LINKS
        for n in world_sizes
        if n > 1
    ]
    return cases


def over_links(dtypes: list, world_sizes: list) -> list:
    """(links, n, dtype) for pytest.mark.parametrize("links,n,dtype", ...): every dtype at
    every world size on MATRIX_LINKS; on the other transports the first dtype of each
    element width, at world sizes above 1 (a world of one has no links), the sizes
    outside CONTRACT_SIZES only in the extended run."""
    by_width = {}
    for d in dtypes:
        by_width.setdefault(np_dtype(d).itemsize, d)
    cases = [(MATRIX_LINKS, n, d) for n in world_sizes for d in dtypes]
    cases += [
        (links, n, d) if n in CONTRACT_SIZES else extended(links, n, d)
        for links in OTHER_LINKS
        for n in world_sizes
        if n > 1
        for d in by_width.values()
    ]
    return cases


def np_dtype(name: str) -> np.dtype:
    return BF16 if name == "bfloat16" else np.dtype(name)


def compute_dtype(name: str) -> np.dtype:
    """The dtype the engine computes in: float32 for the 16-bit floats."""
    return np.dtype(np.float32) if name in ("float16", "bfloat16") else np_dtype(name)


def sizes_for(n: int) -> list:
    """0, 1, n-1, n, n+1, primes, and sizes not divisible by n."""
    return sorted({0, 1, max(n - 1, 0), n, n + 1, 2, 7, 13, 97, 1000 * n + 3, 4099})


def contribution(rank: int, count: int, dtype: str, op: str) -> np.ndarray:
    """Rank's input: small integers, so sums and products are exact in every dtype."""
    i = np.arange(count)
    if op == "prod":
        # Products over 8 ranks of {1, 2} stay <= 256: exact even in bfloat16;
        # int8/uint8 wrap-around is checked against numpy's own wrap-around.
        vals = 1 + ((i + rank) % 3 == 0)
    elif op in ("min", "max"):
        vals = (i * 7 + rank * 13) % 23 - (11 if dtype not in ("uint8",) else 0)
    else:
        vals = (i + 3 * rank) % 5 - (2 if dtype != "uint8" else 0)
    return vals.astype(np_dtype(dtype))


def combine(op: str, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """x op y elementwise, in the arrays' own dtype (avg adds; the division comes last)."""
    if op in ("sum", "avg"):
        return x + y
    if op == "prod":
        return x * y
    if op == "min":
        return np.minimum(x, y)
    return np.maximum(x, y)


def expect_errors(cases: list) -> list:
    """Runs (call, exception class) pairs; describes each call that did not raise as expected."""
    errors = []
    for i, (call, exc_type) in enumerate(cases):
        try:
            call()
            errors.append(f"case {i}: no error")
        except exc_type as exc:
            if not str(exc):
                errors.append(f"case {i}: empty message")
        except Exception as exc:  # the wrong class is a failure too
            errors.append(f"case {i}: {type(exc).__name__}: {exc}")
    return errors


def expected(size: int, count: int, dtype: str, op: str) -> np.ndarray:
    """The reduction of every rank's contribution, with the engine's arithmetic."""
    parts = [contribution(r, count, dtype, op) for r in range(size)]
    cd = compute_dtype(dtype)
    acc = parts[0].astype(cd)
    for p in parts[1:]:
        acc = combine(op, acc, p.astype(cd))
        acc = acc.astype(np_dtype(dtype)).astype(cd)  # every hop rounds to the wire dtype
    if op == "avg":
        acc = acc / cd.type(size)
    return acc.astype(np_dtype(dtype))


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Bitwise equality (0 ULP), treating the arrays as raw bytes."""
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def all_reduce_exact_failures(comm, dtype: str) -> list:
    """all_reduce of exactly representable data against the numpy reference, bit for bit,
    for every op and size: out of place (input untouched), in place and into ``out=``.
    Returns what failed; runs 3 all_reduce calls per (op, size)."""
    failures = []
    n, r = comm.world_size, comm.rank
    for op in OPS:
        if op == "avg" and dtype not in FLOATING:
            continue
        for count in sizes_for(n):
            want = expected(n, count, dtype, op)
            x = contribution(r, count, dtype, op)
            got = comm.all_reduce(x, op=op)
            if not same_bits(got, want):
                failures.append(f"out-of-place {dtype} {op} count={count}")
            if not same_bits(x, contribution(r, count, dtype, op)):
                failures.append(f"out-of-place {dtype} {op} count={count} modified its input")
            inplace = contribution(r, count, dtype, op)
            res = comm.all_reduce(inplace, op=op, out=inplace)
            if res is not inplace or not same_bits(inplace, want):
                failures.append(f"in-place {dtype} {op} count={count}")
            out = np.full(count, 99, dtype=np_dtype(dtype))
            comm.all_reduce(x, op=op, out=out)
            if not same_bits(out, want):
                failures.append(f"out= {dtype} {op} count={count}")
    return failures


def all_reduce_exact_calls(n: int, dtype: str) -> int:
    """How many all_reduce calls all_reduce_exact_failures makes at world size n."""
    ops = [op for op in OPS if op != "avg" or dtype in FLOATING]
    return 3 * len(ops) * len(sizes_for(n))
