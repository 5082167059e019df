"""Compressed all_reduce and reduce_scatter of device arrays (``compressed.py``).

The codec runs where the data is: the built-in codecs' CUDA kernels
(csrc/kernels/codec_cuda.cu, through ``_core.DeviceCodec``) encode on the device, so
only payloads cross to the host (2 to 8 times fewer bytes than float32 cross PCIe,
too); the exchanges are the host path's, with the same rows, headers and seeds; the
owner's sum, its re-encode and the final decode run on the device again. The bits are
the host path's: a call on device arrays gives what the same call on host copies of
them gives, residuals included, on every rank. Tests run this on the fake device
(the CPU emulation of csrc/executor/fake_device.cc).

Not on device arrays yet: codecs with Python methods (they run on host arrays), and
calls in pieces (a device call is always whole). An ``ErrorFeedback`` keeps a device
call's residual on the device, in an array of the input's library (torch, cupy). The
canary copies the input and the sums to the host on the calls it samples.
"""

from __future__ import annotations

import contextlib
import threading
import time
import types
from typing import Any, Iterator, Optional

import numpy as np

from ... import _core
from ..._arrays.buffer import Buffer, describe, dtype_code
from ...compression import rows as _rows
from ...compression.codecs import Codec, seed_key
from ...compression.rows import HEADER
from ..core.ops import ReduceOp
from . import hop as _hop

__all__ = ["DeviceArray", "call", "exact_with_residual", "residual_of"]

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


def _download(dc: Any, ptr: int, count: int, dtype: Any) -> np.ndarray:
    host = np.empty(count, dtype)
    dc.copy(host.ctypes.data, ptr, host.nbytes)
    return host


def call(comm, st, codec, buf, member, res, out_buf, call_no, stat, scratch, scatter, canary):
    """Runs one compressed call of device array ``buf`` into ``out_buf`` (whole, in the
    one-hop scheme of compressed_hop.one_hop with one piece, so the same seeds and
    bits). ``canary``: (the sample's indices, a function checking the quality canary on
    host copies of the sample and the sums), or None when this call is not sampled."""
    with _codec(comm, st, buf.device) as dc:
        _one_hop(
            dc, comm, codec, buf, member, res, out_buf, call_no, stat, scratch, scatter, canary
        )


def _one_hop(dc, comm, codec, buf, member, res, out_buf, call_no, stat, scratch, scatter, canary):
    kernel = _hop._kernel(codec)
    dc.begin(buf.stream)
    n, size, rank = buf.size, comm.world_size, comm.rank
    bounds = [_core.chunk_bounds(n, size, k) for k in range(size)]
    lo, hi = bounds[rank]
    m = hi - lo
    what = "reduce_scatter" if scatter else "all_reduce"
    t_codec = time.perf_counter()

    # x as float32 on the device (x itself when it is float32).
    x = buf.ptr
    if buf.dtype != "float32":
        x = dc.buffer("wide", n * _F32)
        dc.convert(_F32_CODE, x, dtype_code(buf.dtype), buf.ptr, n)
    r = res.ptr if res is not None else 0
    sample = None
    if canary is not None:
        idx = canary[0]
        sample = (idx, _download(dc, x, n, np.float32)[idx])

    header = _rows.header(n, codec, call_no)
    row = _rows.row_bytes(codec, max(b - a for a, b in bounds))
    send = scratch.get("send", (size, row))
    send[:, :HEADER] = header
    recv = scratch.get("recv", (size, row)) if size > 1 else send
    to_f32 = out_buf.dtype == "float32"
    acc = out_buf.ptr if scatter and to_f32 else dc.buffer("acc", max(m, 1) * _F32)
    if m:  # the owner's sum starts as its own contribution, never encoded
        if r:
            dc.add(acc, x + lo * _F32, r + lo * _F32, m)
        else:
            dc.copy(acc, x + lo * _F32, m * _F32)
    for k, (a, b) in enumerate(bounds):  # chunk k to rank k; the worker error stays here
        if k != rank and b > a:
            key = seed_key(_hop.seed(call_no, _hop.WORKER, rank, k))
            dc.encode(kernel, x + a * _F32, b - a, key, send[k, HEADER:], r and r + a * _F32)
    t_codec = time.perf_counter() - t_codec

    def exchange(run: Any) -> None:
        if size > 1:
            before = comm._core.stats()["bytes_sent"]
            run()
            stat.wire_bytes += comm._core.stats()["bytes_sent"] - before

    exchange(lambda: comm.all_to_all(send, out=recv))
    _rows.check_headers(recv, header, codec, rank, what)
    t0 = time.perf_counter()
    if m:
        payloads = [recv[j, HEADER:] for j in range(size) if j != rank]
        dc.decode_add(kernel, payloads, m, acc)
    if scatter:
        if r and m:
            dc.zero(r + lo * _F32, m * _F32)  # sent whole: nothing owed
        result, count = acc, m
    else:  # the sum encoded once; the owner's error stays with it, in sum units
        row_out = recv[rank]
        row_out[:HEADER] = header
        if m:
            key = seed_key(_hop.seed(call_no, _hop.OWNER, rank, rank))
            dc.encode(kernel, acc, m, key, row_out[HEADER:], r and r + lo * _F32, True)
        t_codec += time.perf_counter() - t0
        exchange(lambda: comm.all_gather(recv[rank], out=send))
        _rows.check_headers(send, header, codec, rank, what)
        t0 = time.perf_counter()
        result, count = (out_buf.ptr if to_f32 else dc.buffer("sum", n * _F32)), n
        for k, (a, b) in enumerate(bounds):
            if b > a:
                dc.decode(kernel, send[k, HEADER:], b - a, result + a * _F32)
    stat.codec_seconds += t_codec + time.perf_counter() - t0
    if canary is not None:
        canary[1](sample, _download(dc, result, count, np.float32))
    if member is ReduceOp.AVG and count:
        dc.divide(result, count, size)
    if not to_f32 and count:
        dc.convert(dtype_code(out_buf.dtype), out_buf.ptr, _F32_CODE, result, count)


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
