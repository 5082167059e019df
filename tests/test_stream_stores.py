"""Streaming stores (RINGREDUCE_STREAM_STORE_BYTES): a host all_reduce out of place whose
reduce steps write their output with non-temporal stores gives the same bits as the
plain kernels, for float32 and float64 sums and averages, with the output at any
alignment, including infinities, NaN and signed zeros; other dtypes, ops and in-place
calls keep the plain kernels (and their results)."""

from __future__ import annotations

import numpy as np
import pytest

from _ranks import RankGroup

# Every reduce step streams (1 byte), or none does (0).
_groups: dict = {}


@pytest.fixture(scope="module")
def group():
    def get(n: int, transport: str, stream: bool) -> RankGroup:
        key = (n, transport, stream)
        if key not in _groups:
            env = {"RINGREDUCE_STREAM_STORE_BYTES": "1" if stream else "0"}
            _groups[key] = RankGroup(n, transport=transport, env=env)
        return _groups[key]

    yield get
    for g in _groups.values():
        g.close()
    _groups.clear()


# Above the small-message path at every world size here, odd so that chunks and
# segments end mid-vector; 2**20 + 5 float64 is 8 MB: several segments a step.
COUNTS = (20011, 100003, (1 << 20) + 5)


def _data(rank: int, count: int, dtype: str) -> np.ndarray:
    rng = np.random.default_rng([rank, count])
    x = (rng.standard_normal(count) * 10.0 ** rng.integers(-30, 30, count)).astype(dtype)
    x[::997] = np.inf if rank % 2 else -np.inf  # inf + -inf: NaN where ranks differ
    x[5::1009] = np.nan
    x[7::1013] = -0.0
    return x


def _reduce(comm, dtype: str, op: str, offset: int, in_place: bool) -> list:
    """Every count's all_reduce, the output at `offset` elements into a larger array
    (so its alignment differs from the input's), as bytes."""
    got = []
    for count in COUNTS:
        x = _data(comm.rank, count, dtype)
        if in_place:
            buf = np.zeros(count + offset, dtype)
            out = buf[offset:]
            out[...] = x
            comm.all_reduce(out, op, out=out)
        else:
            buf = np.full(count + offset, 7, dtype)
            out = buf[offset:]
            comm.all_reduce(x, op, out=out)
        got.append(out.tobytes())
    return got


@pytest.mark.parametrize("n, transport", [(2, "shm"), (3, "tcp")])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("op", ["sum", "avg"])
def test_streamed_outputs_have_the_plain_kernels_bits(group, n, transport, dtype, op):
    for offset, in_place in [(0, False), (1, False), (3, False), (1, True)]:
        streamed = group(n, transport, True).run(_reduce, dtype, op, offset, in_place)
        plain = group(n, transport, False).run(_reduce, dtype, op, offset, in_place)
        assert streamed == plain, (offset, in_place)
        assert all(r == streamed[0] for r in streamed)  # every rank the same bits
    # And they are the sum: against float64 numpy (inf + -inf is NaN there too).
    streamed = group(n, transport, True).run(_reduce, dtype, op, 1, False)
    got = np.frombuffer(streamed[0][0], dtype)
    with np.errstate(invalid="ignore"):
        total = np.sum([_data(r, COUNTS[0], dtype).astype(np.float64) for r in range(n)], axis=0)
    if op == "avg":
        total /= n
    finite = np.isfinite(total)
    rel = np.abs(got[finite] - total[finite]) / np.maximum(np.abs(total[finite]), 1e-300)
    assert np.all(rel < (1e-5 if dtype == "float32" else 1e-12))
    assert np.array_equal(np.isnan(got), np.isnan(total))
    assert np.array_equal(got[np.isinf(total)], total[np.isinf(total)])


def _reduce_int(comm, op: str) -> bytes:
    x = np.arange(100003, dtype=np.int64) * (comm.rank + 1)
    out = np.empty_like(x)
    comm.all_reduce(x, op, out=out)
    return out.tobytes()


@pytest.mark.parametrize("op", ["sum", "max"])
def test_other_dtypes_and_ops_keep_the_plain_kernels(group, op):
    streamed = group(2, "shm", True).run(_reduce_int, op)
    plain = group(2, "shm", False).run(_reduce_int, op)
    assert streamed == plain
    want = np.arange(100003, dtype=np.int64) * (3 if op == "sum" else 2)
    assert np.frombuffer(streamed[0], np.int64).tolist() == want.tolist()
