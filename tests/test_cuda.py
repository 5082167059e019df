"""The CUDA kernels on a real device, against the CPU kernels and numpy.

The CPU and CUDA kernels call the same functors (csrc/reduce/ops.h), so their
results must agree bit for bit, signed zeros and all; numpy is the independent
reference. Device memory comes from the extension itself (DeviceBuffer), so
these tests need neither torch nor cupy; one test checks torch interop when
torch.cuda is usable. Skipped cleanly without a device.
"""

from __future__ import annotations

import numpy as np
import pytest
from _kernels import (
    DTYPE_CODES,
    FLOATS,
    GUARD,
    OP_CODES,
    POISON,
    describe,
    divide_reference,
    mismatches,
    random_operands,
    reference,
    run,
)

from ringreduce import _core
from ringreduce._cuda import DeviceBuffer, cuda_available

from _data import DTYPES, OPS

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not cuda_available(), reason="no usable CUDA device"),
]

# Sizes around a 16-byte pack of every dtype, and one large enough that every
# thread of the grid-stride loop goes round several times.
SIZES = [1, 7, 8, 9, 15, 16, 17, 33, 4099, (1 << 20) + 3]


# Element offsets of (out, a, b) from a 256-byte boundary: all aligned (packs
# throughout), equally misaligned (a head of single elements, then packs), and
# differently misaligned (single elements throughout).
LAYOUTS = {"aligned": (0, 0, 0), "same-offset": (1, 1, 1), "mixed-offsets": (0, 1, 2)}


def reduce_on_device(dtype: str, op: str, a: np.ndarray, b: np.ndarray, shifts) -> np.ndarray:
    """out = a op b on the device, each buffer `shifts` elements past a 256-byte boundary."""
    n, size = a.size, a.itemsize
    offs = [shift * size for shift in shifts]
    bufs = [DeviceBuffer(off + n * size + GUARD) for off in offs]
    try:
        out, da, db = bufs
        out.upload(np.full(out.nbytes, POISON, dtype=np.uint8))
        # Other bytes around the inputs, so an overrun cannot copy poison into poison.
        for buf in (da, db):
            buf.upload(np.full(buf.nbytes, POISON ^ 0xFF, dtype=np.uint8))
        da.upload(a, offs[1])
        db.upload(b, offs[2])
        ptrs = [buf.ptr + off for buf, off in zip(bufs, offs)]
        _core.cuda_reduce_test(DTYPE_CODES[dtype], OP_CODES[op], *ptrs, n)
        raw = out.download(np.uint8, out.nbytes)
    finally:
        for buf in bufs:
            buf.close()
    off = offs[0]
    assert (raw[:off] == POISON).all() and (raw[off + n * size :] == POISON).all(), "overrun"
    return raw[off : off + n * size].view(a.dtype)


def check_against_cpu_and_numpy(dtype: str, op: str, a, b, got) -> None:
    cpu = run(dtype, op, a, b)
    assert mismatches(got, cpu).size == 0, "GPU vs CPU: " + describe(got, cpu, a, b)
    want = reference(dtype, op, a, b)
    zeros = op not in ("min", "max")
    assert mismatches(got, want, zeros).size == 0, "GPU vs numpy: " + describe(got, want, a, b)


def test_device_is_counted():
    assert _core.cuda_device_count() >= 1


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_dtype_and_op(dtype, op, layout):
    for i, n in enumerate(SIZES):
        a = random_operands(dtype, n, seed=100 + 2 * i)
        b = random_operands(dtype, n, seed=101 + 2 * i)
        got = reduce_on_device(dtype, op, a, b, LAYOUTS[layout])
        check_against_cpu_and_numpy(dtype, op, a, b, got)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_in_place(dtype, op):
    n = 100_003
    a = random_operands(dtype, n, seed=5)
    b = random_operands(dtype, n, seed=6)
    with DeviceBuffer.from_array(a) as da, DeviceBuffer.from_array(b) as db:
        _core.cuda_reduce_test(DTYPE_CODES[dtype], OP_CODES[op], da.ptr, da.ptr, db.ptr, n)
        got = da.download(a.dtype, n)
    check_against_cpu_and_numpy(dtype, op, a, b, got)


@pytest.mark.parametrize("divisor", [1, 3, 8])
@pytest.mark.parametrize("dtype", FLOATS)
def test_divide(dtype, divisor):
    for n in SIZES:
        x = random_operands(dtype, n, seed=n)
        with DeviceBuffer.from_array(x) as dx:
            _core.cuda_divide_test(DTYPE_CODES[dtype], dx.ptr, n, divisor)
            got = dx.download(x.dtype, n)
        cpu = x.copy()
        _core.divide_local(DTYPE_CODES[dtype], cpu.ctypes.data, n, divisor)
        assert mismatches(got, cpu).size == 0, describe(got, cpu, x, x)
        want = divide_reference(dtype, x, divisor)
        assert mismatches(got, want).size == 0, describe(got, want, x, x)


def test_zero_elements_touch_nothing():
    with DeviceBuffer(64) as buf:
        buf.upload(np.full(64, POISON, dtype=np.uint8))
        _core.cuda_reduce_test(
            DTYPE_CODES["float32"], OP_CODES["sum"], buf.ptr, buf.ptr, buf.ptr, 0
        )
        assert (buf.download(np.uint8, 64) == POISON).all()


def test_host_memory_is_rejected():
    x = np.zeros(16, dtype=np.float32)
    with DeviceBuffer.from_array(x) as d, pytest.raises(ValueError, match="not CUDA device"):
        _core.cuda_reduce_test(DTYPE_CODES["float32"], 0, d.ptr, x.ctypes.data, d.ptr, 16)


def test_torch_tensors_on_torch_stream():
    # Pointers and streams made by torch's own CUDA runtime work with ours.
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    n = 1 << 20
    a = random_operands("float32", n, seed=1)
    b = random_operands("float32", n, seed=2)
    ta, tb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
    out = torch.full_like(ta, float("nan"))
    stream = torch.cuda.current_stream().cuda_stream
    _core.cuda_reduce_test(
        DTYPE_CODES["float32"], OP_CODES["sum"], out.data_ptr(), ta.data_ptr(), tb.data_ptr(), n,
        stream,
    )  # fmt: skip
    check_against_cpu_and_numpy("float32", "sum", a, b, out.cpu().numpy())
