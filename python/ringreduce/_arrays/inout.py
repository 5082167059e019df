"""A collective's input and output as the engine takes them: the input described (and
made contiguous where needed), the output checked against what the call writes or
allocated like the input, and the two kept apart where they would overlap. A call
enters this room once for its input and once for its output."""

from __future__ import annotations

from typing import Any, Optional, Tuple

from .buffer import Buffer, describe, dtype_code
from .kinds import array_for, kind_of

__all__ = ["NOTHING", "apart", "input_buffer", "output_buffer", "overlap"]

# No memory: the buffer of a rank that neither sends nor receives in a call.
NOTHING = Buffer(None, 0, (0,), "uint8", 1, -1, 0, True, False)


def overlap(a: Buffer, b: Buffer) -> bool:
    """a and b share at least one byte."""
    return a.nbytes > 0 and b.nbytes > 0 and a.ptr < b.ptr + b.nbytes and b.ptr < a.ptr + a.nbytes


def input_buffer(x: Any, what: str = "x") -> Buffer:
    """x's Buffer, of a supported dtype; a contiguous copy when x is not contiguous."""
    buf = describe(x, what)
    dtype_code(buf.dtype, what)
    if not buf.contiguous:
        if buf.host is None and kind_of(buf.obj) is None:
            raise ValueError(
                f"{what}: the CUDA array is not C-contiguous; pass a contiguous one "
                "(ringreduce makes contiguous copies of torch tensors and cupy arrays only)"
            )
        kind, arr = array_for(buf, what)
        buf = describe(kind.contiguous(arr), what)
    return buf


def output_buffer(out: Any, like: Buffer, shape: Tuple[int, ...]) -> Tuple[Any, Buffer]:
    """(result, its Buffer): ``out`` checked against what the call writes, or a new array
    allocated like the input."""
    if out is None:
        kind, arr = array_for(like, "out")
        result = kind.empty(arr, shape)
        return result, describe(result, "out")
    buf = describe(out, "out")
    if buf.device != like.device:
        raise ValueError(
            f"out is in {buf.where} but x is in {like.where}; pass both on the same "
            "device, or both on the host"
        )
    if buf.dtype != like.dtype:
        raise TypeError(f"out: dtype {buf.dtype} does not match the input's {like.dtype}")
    if buf.shape != tuple(shape):
        raise ValueError(f"out: shape {buf.shape} does not match the expected {tuple(shape)}")
    if buf.readonly:
        raise ValueError("out: the array is read-only")
    if not buf.contiguous:
        raise ValueError("out: the array must be C-contiguous (results are written in place)")
    return out, buf


def apart(src: Buffer, dst: Buffer, in_place_at: Optional[int] = None) -> Buffer:
    """src, or a copy of it where it shares memory with dst: the engine reads src while it
    writes dst, so a shared byte could be overwritten before it is sent. ``in_place_at``:
    the address in dst where the collective takes src as it is (its in-place form, as
    MPI_IN_PLACE)."""
    if src.ptr == in_place_at or not overlap(src, dst):
        return src
    kind, arr = array_for(src, "x")
    return describe(kind.copy(arr), "x")
