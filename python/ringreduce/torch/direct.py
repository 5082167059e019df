"""The direct route of the torch backend: tensors the engine takes as they are go
straight to it.

Most calls torch.distributed makes (DDP's buckets, FSDP2's all-gathers and
reduce-scatters, ``dist.all_reduce`` of a tensor) pass dense, contiguous tensors of a
dtype the engine has, on the CPU or a GPU. For those the backend needs no shaping, no
staging and no numpy view: the call is the tensor's address, its element count and two
small codes, handed to the communicator's gate in one builtin call (``IssueGate.issue``
in the engine: no Python frame, no argument conversion). It runs there on this thread
(blocking) or is queued on the engine's worker (``async_op``), exactly as the general
path would run it (the same engine call, so the same bits).

`Direct` answers None wherever the general path must decide (another dtype or layout, a
lazily negated view, compressed calls waiting in the communicator's lane): the caller
then takes the general path, with nothing issued.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as dist

from .. import _core
from .._comm.core.work import Work
from ..errors import RingReduceError

__all__ = ["AVG_CODE", "CODES", "Direct", "OP_CODES", "direct_dtype"]

_K = _core.Collective
ALL_REDUCE = int(_K.ALL_REDUCE)
REDUCE_SCATTER = int(_K.REDUCE_SCATTER)
ALL_GATHER = int(_K.ALL_GATHER)
BROADCAST = int(_K.BROADCAST)
BARRIER = int(_K.BARRIER)
REDUCE = int(_K.REDUCE)
ALL_TO_ALL = int(_K.ALL_TO_ALL)

# The engine's dtype codes of the torch dtypes it reduces as they are.
_DTYPES = {
    torch.float16: _core.DType.float16,
    torch.bfloat16: _core.DType.bfloat16,
    torch.float32: _core.DType.float32,
    torch.float64: _core.DType.float64,
    torch.int8: _core.DType.int8,
    torch.uint8: _core.DType.uint8,
    torch.int32: _core.DType.int32,
    torch.int64: _core.DType.int64,
}
_CODES = {dtype: int(code) for dtype, code in _DTYPES.items()}
CODES = dict(_CODES)
"""The engine's dtype code of each torch dtype it reduces as it is."""
_UINT8 = int(_core.DType.uint8)
_R = dist.ReduceOp
# (torch's op, the engine's code); AVG is for floating dtypes only (the caller checks).
OP_CODES = (
    (_R.SUM, int(_core.Op.SUM)),
    (_R.AVG, int(_core.Op.AVG)),
    (_R.MAX, int(_core.Op.MAX)),
    (_R.MIN, int(_core.Op.MIN)),
    (_R.PRODUCT, int(_core.Op.PROD)),
)
_AVG = AVG_CODE = int(_core.Op.AVG)
_SUM, _SUM_CODE = OP_CODES[0]
_STRIDED = torch.strided


def direct_dtype(t: torch.Tensor) -> Optional[int]:
    """The engine's dtype code for a tensor the engine can take as it is (dense,
    contiguous, not a lazily negated view, of a dtype it reduces), else None."""
    code = _CODES.get(t.dtype)
    if code is None or t.layout is not torch.strided or not t.is_contiguous() or t.is_neg():
        return None
    return code


def _op_code(op: Any, floating: bool) -> Optional[int]:
    for known, code in OP_CODES:
        if op == known:
            return None if code == _AVG and not floating else code
    return None


class Direct:
    """The direct route of one communicator: each method returns None (not taken: the
    general path decides), True (a blocking call that ran) or a `Work` (queued)."""

    def __init__(self, comm: Any):
        self.comm = comm
        self._issue = _core.bind_issue(comm._issuer.gate)

    def _call(
        self,
        kind: int,
        send: torch.Tensor,
        recv: torch.Tensor,
        count: int,
        dtype: int,
        op: int,
        root: int,
        async_op: bool,
    ) -> Any:
        if send.is_cuda:
            device = send.get_device()
            if recv.get_device() != device:
                return None  # the general path says what is wrong
            stream = torch.cuda.current_stream(device).cuda_stream
        elif recv.is_cuda:
            return None
        else:
            device, stream = -1, 0
        comm = self.comm
        try:
            got = self._issue(
                kind,
                send.data_ptr(),
                recv.data_ptr(),
                count,
                dtype,
                op,
                root,
                device,
                stream,
                async_op,
            )
        except RingReduceError as exc:
            raise comm._fast_failed(exc) from None
        if got is None or got is True:
            return got
        return self.queued(got, (send, recv))

    def queued(self, handle: Any, keep: tuple) -> Work:
        """The Work of a queued call, its tensors kept alive until it is done (even if
        the caller drops the Work)."""
        comm = self.comm
        comm._keep_alive(handle, keep)
        return Work(comm, handle, None, keep)

    def all_reduce(self, t: torch.Tensor, op: Any, async_op: bool) -> Any:
        """``t`` reduced in place. (The most frequent call, written out: each helper call
        and attribute costs a fraction of a microsecond, and the engine's own work on a
        small message is about one.)"""
        dtype = _CODES.get(t.dtype)
        if dtype is None or t.layout is not _STRIDED or not t.is_contiguous() or t.is_neg():
            return None
        if op == _SUM:
            code = _SUM_CODE
        else:
            code = _op_code(op, t.is_floating_point())
            if code is None:
                return None
        if t.is_cuda:
            return self._call(ALL_REDUCE, t, t, t.numel(), dtype, code, 0, async_op)
        ptr = t.data_ptr()
        try:
            got = self._issue(ALL_REDUCE, ptr, ptr, t.numel(), dtype, code, 0, -1, 0, async_op)
        except RingReduceError as exc:
            raise self.comm._fast_failed(exc) from None
        if got is None or got is True:
            return got
        return self.queued(got, (t,))

    def reduce(self, t: torch.Tensor, op: Any, root: int, async_op: bool) -> Any:
        """``t`` reduced in place into ``root``'s."""
        dtype = direct_dtype(t)
        if dtype is None:
            return None
        code = _op_code(op, t.is_floating_point())
        if code is None:
            return None
        return self._call(REDUCE, t, t, t.numel(), dtype, code, root, async_op)

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, op: Any, async_op: bool) -> Any:
        """This rank's equal block of ``inp``'s reduction into ``out`` (torch's
        reduce_scatter_tensor: ``inp`` has world_size times ``out``'s elements)."""
        dtype = direct_dtype(inp)
        if dtype is None or out.dtype != inp.dtype or direct_dtype(out) is None:
            return None
        if inp.numel() != out.numel() * self.comm.world_size:
            return None
        code = _op_code(op, inp.is_floating_point())
        if code is None:
            return None
        return self._call(REDUCE_SCATTER, inp, out, inp.numel(), dtype, code, 0, async_op)

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor, async_op: bool) -> Any:
        """Every rank's ``inp`` into ``out``, in rank order (all_gather_into_tensor)."""
        moved = _movable(inp)
        if moved is None or out.dtype != inp.dtype or _movable(out) is None:
            return None
        if out.numel() != inp.numel() * self.comm.world_size:
            return None
        dtype, count = moved
        return self._call(ALL_GATHER, inp, out, count, dtype, 0, 0, async_op)

    def broadcast(self, t: torch.Tensor, root: int, async_op: bool) -> Any:
        """``root``'s ``t`` into every rank's, in place."""
        moved = _movable(t)
        if moved is None:
            return None
        dtype, count = moved
        return self._call(BROADCAST, t, t, count, dtype, 0, root, async_op)

    def all_to_all(self, out: torch.Tensor, inp: torch.Tensor, async_op: bool) -> Any:
        """Equal blocks of ``inp``'s first dimension to every rank, into ``out``."""
        moved = _movable(inp)
        n = self.comm.world_size
        if moved is None or out.dtype != inp.dtype or _movable(out) is None:
            return None
        if out.numel() != inp.numel() or inp.numel() % n:
            return None
        dtype, count = moved
        return self._call(ALL_TO_ALL, inp, out, count // n, dtype, 0, 0, async_op)

    def barrier(self, async_op: bool) -> Any:
        """Every rank has called it."""
        comm = self.comm
        try:
            got = self._issue(BARRIER, 0, 0, 0, _UINT8, 0, 0, -1, 0, async_op)
        except RingReduceError as exc:
            raise comm._fast_failed(exc) from None
        if got is None or got is True:
            return got
        return self.queued(got, ())


def _movable(t: torch.Tensor) -> Optional[tuple]:
    """(dtype code, element count) to move ``t``'s memory as it is: its own dtype where
    the engine has it, else its bytes; None where it is not dense and contiguous."""
    if t.layout is not torch.strided or not t.is_contiguous() or t.is_neg() or t.is_conj():
        return None
    code = _CODES.get(t.dtype)
    if code is not None:
        return code, t.numel()
    return _UINT8, t.numel() * t.element_size()
