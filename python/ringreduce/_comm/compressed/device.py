"""Device arrays in compressed calls: what the route checks before a call of device
arrays is issued, and the exact call with a device residual that auto's calibration runs.

A compressed all_reduce or reduce_scatter of device arrays with a built-in codec is the
engine's one-hop collective on the device executor (csrc/algorithms/one_hop.h), whose
codec operations are the Device's: the CUDA kernels of csrc/kernels/codec_cuda.cu, with
the CPU loops' bits, so a call on device arrays gives what the same call on host copies
of them gives, residuals included, on every rank; only the rows cross to the host.
Tests run it on the fake device (the CPU emulation of csrc/executor/fake_device.cc).

Codecs with Python methods run on host arrays only (`refuse`). An ``ErrorFeedback``
keeps a device call's residual on the device, in an array of the input's library
(torch, cupy; `residual_of`).
"""

from __future__ import annotations

import contextlib
import threading
import types
from typing import Any, Iterator, Optional

import numpy as np

from ... import _core
from ..._arrays.buffer import Buffer, describe, dtype_code
from ...compression.codecs import Codec
from . import hop as _hop

__all__ = ["DeviceArray", "exact_with_residual", "refuse", "residual_of"]

_F32 = 4  # bytes of a float32
# Device scratch a communicator keeps between calls; a larger call's goes with it.
KEEP_BYTES = 256 << 20
_F32_CODE = dtype_code("float32")


class DeviceArray:
    """A float32 array at a device address, for handing scratch to the engine's
    collectives (``__cuda_array_interface__``, with the owning device's id)."""

    def __init__(self, ptr: int, shape: tuple, device: int) -> None:
        self.ptr, self.shape = ptr, tuple(shape)
        self.dtype = np.dtype(np.float32)
        self.device = types.SimpleNamespace(id=device)

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": self.shape, "typestr": "<f4", "data": (self.ptr, False), "version": 3}


@contextlib.contextmanager
def _codec(comm: Any, st: Any, device: int) -> Iterator[Any]:
    """The communicator's DeviceCodec for ``device`` (made once, kept in its state), or,
    while another thread's call holds it (calls from two threads at once, which the
    communicator reports as an error), one of this call's own: two calls never share
    its scratch or its lanes. After each call it keeps at most KEEP_BYTES of scratch."""
    kept = st.__dict__.setdefault("device_codecs", {})
    fake = bool(getattr(comm._core, "fake_device", False))
    if device not in kept:
        kept[device] = (_core.DeviceCodec(device, fake, float(comm.timeout)), threading.Lock())
    dc, lock = kept[device]
    if not lock.acquire(blocking=False):
        yield _core.DeviceCodec(device, fake, float(comm.timeout))
        return
    try:
        yield dc
    finally:
        dc.trim(KEEP_BYTES)
        lock.release()


def refuse(codec: Any) -> None:
    """Raises TypeError for a codec that cannot run on device arrays (one with Python
    methods); before any rank talks."""
    if isinstance(codec, Codec) and _hop._kernel(codec) is None:
        raise TypeError(
            f"x: codec {codec.name!r} has no device kernels (its encode and decode are "
            "Python methods on host arrays); pass host arrays, or a built-in codec "
            "(bf16, fp16, int8, int4)"
        )


def residual_of(error_feedback: Any, buf: Buffer) -> Buffer:
    """The device residual of a call on device array ``buf``: an `ErrorFeedback`'s, kept
    beside x on its device (an array of x's library), or the array given, which must be
    a writable, contiguous float32 device array of x's size on x's device."""
    if hasattr(error_feedback, "residual_like"):  # an ErrorFeedback (or a key's view)
        return describe(error_feedback.residual_like(buf.obj, buf.size), "error_feedback")
    res = describe(error_feedback, "error_feedback")
    if (
        res.device != buf.device
        or res.dtype != "float32"
        or res.size != buf.size
        or not res.contiguous
        or res.readonly
    ):
        raise ValueError(
            f"error_feedback: a residual for x on {buf.where} must be a writable, "
            f"contiguous float32 array of {buf.size} values there, got {res.dtype} "
            f"{res.shape} in {res.where}"
        )
    return res


def exact_with_residual(
    comm: Any,
    st: Any,
    buf: Buffer,
    op: str,
    result: Any,
    res: Buffer,
    out_buf: Buffer,
    scatter: bool,
) -> Optional[Any]:
    """The exact call of device array ``buf`` with the residual earlier compressed calls
    left: ``x + residual`` is reduced in float32 and the residual cleared (what it owed
    reaches the sum). Unlike the host path, which looks whether the residual is all
    zeros first, this always reduces in float32."""
    with _codec(comm, st, buf.device) as dc:
        return _exact(dc, comm, buf, op, result, res, out_buf, scatter)


def _exact(dc, comm, buf, op, result, res, out_buf, scatter):
    dc.begin(buf.stream)
    n = buf.size
    wide = dc.buffer("wide", n * _F32)
    if buf.dtype == "float32":
        dc.add(wide, buf.ptr, res.ptr, n)
    else:
        dc.convert(_F32_CODE, wide, dtype_code(buf.dtype), buf.ptr, n)
        dc.add(wide, wide, res.ptr, n)
    dc.zero(res.ptr, n * _F32)
    v = DeviceArray(wide, buf.shape, buf.device)
    count = out_buf.size
    if out_buf.dtype == "float32":
        target = result
    else:
        target = DeviceArray(dc.buffer("sum", count * _F32), out_buf.shape, buf.device)
    if scatter:
        comm.reduce_scatter(v, op, out=target)
    else:
        comm.all_reduce(v, op, out=target)
    if target is not result:
        dc.convert(dtype_code(out_buf.dtype), out_buf.ptr, _F32_CODE, target.ptr, count)
    return result
