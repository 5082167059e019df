"""Array handling: torch tensors, bfloat16, DLPack, and bad local input.

Bad input must fail on the calling rank before any communication, leaving the
communicator usable; non-contiguous input must give correct results.
"""

from __future__ import annotations

import numpy as np
import pytest

import ringreduce as rr

from _data import BF16, expect_errors


@pytest.fixture(scope="module")
def solo():
    comm = rr.init("tcp", rank=0, world_size=1)
    yield comm
    comm.close()


def _bad_inputs_then_good_call(comm):
    """Every bad call raises locally; the next good call still works on all ranks."""
    x = np.ones(10, dtype=np.float32)
    cases = [
        (lambda: comm.all_reduce(np.ones(3, dtype=np.complex64)), TypeError),
        (lambda: comm.all_reduce(np.ones(3, dtype=bool)), TypeError),
        (lambda: comm.all_reduce(np.ones(3, dtype=np.int32), op="avg"), ValueError),
        (lambda: comm.all_reduce(x, op="median"), ValueError),
        (lambda: comm.all_reduce(x, out=np.ones(9, dtype=np.float32)), ValueError),
        (lambda: comm.all_reduce(x, out=np.ones(10, dtype=np.float64)), TypeError),
        (lambda: comm.all_reduce(x, out=np.ones(20, dtype=np.float32)[::2]), ValueError),
        (lambda: comm.all_reduce(x, out=_readonly(10)), ValueError),
        (lambda: _overlap_call(comm), ValueError),
        (lambda: comm.reduce_scatter(x, out=np.ones(99, dtype=np.float32)), ValueError),
        (
            lambda: comm.all_gather(x, out=np.ones((comm.world_size, 9), dtype=np.float32)),
            ValueError,
        ),
        (lambda: comm.broadcast(x, root=comm.world_size), ValueError),
        (lambda: comm.broadcast(x, root=-1), ValueError),
        (lambda: comm.all_reduce("not an array"), TypeError),
        # Non-native byte order would be reduced as native numbers: refused, in and out.
        (lambda: comm.all_reduce(x.astype(">f4")), TypeError),
        (lambda: comm.all_reduce(x, out=np.ones(10, dtype=">f4")), TypeError),
        (lambda: comm.broadcast(np.ones(4, dtype=">i8"), root=0), TypeError),
    ]
    errors = expect_errors(cases)
    try:
        comm.all_reduce(x.astype(">f4"))
    except TypeError as exc:
        if "byte order" not in str(exc):
            errors.append(f"byte order not named: {exc}")
    y = comm.all_reduce(np.full(5, comm.rank, dtype=np.int64))
    if not np.all(y == sum(range(comm.world_size))):
        errors.append("the communicator is broken after bad input")
    return errors


def _readonly(n):
    a = np.ones(n, dtype=np.float32)
    a.flags.writeable = False
    return a


def _overlap_call(comm):
    big = np.ones(20, dtype=np.float32)
    # out shares memory with x without being x: the result would be garbage.
    return comm.all_reduce(big[:10], out=big[1:11])


def _noncontiguous(comm):
    n, r = comm.world_size, comm.rank
    base = np.arange(60, dtype=np.float64).reshape(6, 10) + r
    view = base[::2, 1::3]  # strided in both axes
    want = sum((np.arange(60, dtype=np.float64).reshape(6, 10) + i)[::2, 1::3] for i in range(n))
    ok = np.array_equal(comm.all_reduce(view), want)
    ok &= np.array_equal(comm.all_gather(view)[r], view)
    fortran = np.asfortranarray(np.arange(12.0).reshape(3, 4) * (r + 1))
    ok &= np.array_equal(comm.all_reduce(fortran), np.arange(12.0).reshape(3, 4) * n * (n + 1) / 2)
    return bool(ok)


def _torch_tensors(comm, dtype_name):
    import torch

    n, r = comm.world_size, comm.rank
    dtype = getattr(torch, dtype_name)
    t = torch.arange(10, dtype=dtype) + r
    want = sum(torch.arange(10, dtype=dtype) + i for i in range(n))
    out = comm.all_reduce(t)
    ok = isinstance(out, torch.Tensor) and out.dtype == dtype and torch.equal(out, want)
    comm.all_reduce(t, out=t)  # in place on the tensor's own memory
    ok &= torch.equal(t, want)
    g = torch.ones(3, 2, dtype=dtype, requires_grad=dtype.is_floating_point) * r
    ok &= comm.all_gather(g.detach() if g.requires_grad else g).shape == (n, 3, 2)
    return bool(ok)


def _bfloat16(comm):
    n, r = comm.world_size, comm.rank
    x = (np.arange(100) % 7 + r).astype(BF16)
    want = sum((np.arange(100) % 7 + i) for i in range(n)).astype(BF16)
    return bool(np.array_equal(comm.all_reduce(x).view(np.uint16), want.view(np.uint16)))


@pytest.mark.parametrize("n", [1, 2, 3])
def test_bad_local_input_raises_before_communication(group_factory, n):
    assert group_factory(n).run(_bad_inputs_then_good_call) == [[]] * n


@pytest.mark.parametrize("n", [1, 2, 3])
def test_non_contiguous_input_gives_correct_results(group_factory, n):
    assert group_factory(n).run(_noncontiguous) == [True] * n


@pytest.mark.parametrize("n", [1, 2, 3])
def test_ml_dtypes_bfloat16(group_factory, n):
    assert group_factory(n).run(_bfloat16) == [True] * n


@pytest.mark.torch
@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16", "float16", "int64", "int8"])
def test_torch_cpu_tensors(group_factory, dtype):
    pytest.importorskip(
        "torch", reason="needs torch: pip install torch (the CPU wheel is enough; docs/install.md)"
    )
    assert group_factory(2).run(_torch_tensors, dtype) == [True, True]


def test_dlpack_and_buffer_protocol_objects(solo):
    class OnlyDLPack:
        def __init__(self, a):
            self._a = a

        def __dlpack__(self, **kw):
            return self._a.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self._a.__dlpack_device__()

    a = np.arange(6, dtype=np.float32)
    assert np.array_equal(solo.all_reduce(OnlyDLPack(a)), a)
    buf = bytearray(b"\x01\x02\x03")
    assert solo.all_reduce(buf).tolist() == [1, 2, 3]


def test_world_of_one_needs_no_network(solo):
    assert solo.world_size == 1 and solo.rank == 0
    x = np.arange(5.0)
    assert np.array_equal(solo.all_reduce(x, op="avg"), x)
    assert solo.all_gather(x).shape == (1, 5)
    assert np.array_equal(solo.reduce_scatter(x), x)


def test_build_info():
    info = rr.build_info()
    assert info["version"] == rr.__version__
    assert "tcp" in info["transports"]
    assert isinstance(info["mpi"], bool) and isinstance(info["cuda"], bool)


def _ops_by_enum_and_string(comm):
    # Each rank's values differ, so min, max and the sum tell the ops apart.
    n, r = comm.world_size, comm.rank
    x = np.array([3.0 + r, -1.0 - 2 * r, float(r * r)])
    got = [
        comm.all_reduce(x, op=rr.ReduceOp.MAX),
        comm.all_reduce(x, op="MIN"),
        comm.all_reduce(x, op="Sum"),
        comm.all_reduce(x, op=rr.ReduceOp.AVG),
    ]
    ranks = np.arange(n, dtype=np.float64)
    want = [
        np.array([3.0 + n - 1, -1.0, (n - 1) ** 2]),
        np.array([3.0, -1.0 - 2 * (n - 1), 0.0]),
        np.array([3.0 * n + ranks.sum(), -n - 2 * ranks.sum(), (ranks**2).sum()]),
    ]
    want.append(want[2] / n)
    return all(np.array_equal(g, w) for g, w in zip(got, want))


@pytest.mark.parametrize("n", [2, 3])
def test_reduce_op_enum_and_strings(group_factory, n):
    assert group_factory(n).run(_ops_by_enum_and_string) == [True] * n
