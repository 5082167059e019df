"""Argument shaping: a collective's Python arguments turned into the one `Call` the
engine runs (its kind, send and receive buffers, op, root, count, and the result to hand
back). Bad arguments fail here with ValueError/TypeError, before any rank talks to
another. Each function takes this rank and the world size, not the communicator."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Tuple

import numpy as np

from ... import _core
from ..._arrays.buffer import Buffer, describe, dtype_code
from ..._arrays.inout import NOTHING, apart, input_buffer, output_buffer, overlap
from ..._arrays.kinds import array_for
from .ops import op_code

__all__ = ["Call", "chunk_bounds"]

_Collective = _core.Collective
_SUM = _core.Op.SUM


@dataclass
class Call:
    """One collective as the engine takes it. ``keep``: the caller's objects, alive until
    the call is done; ``finalize``: run once it is done (e.g. copy back into x)."""

    kind: Any
    send: Buffer
    recv: Buffer
    op: Any
    root: int
    result: Any
    keep: tuple
    finalize: Optional[Callable[[], None]] = None
    count: Optional[int] = None
    blocks: Optional[list] = None
    # A compressed collective's codec and state (``_core`` submit/run's compression=).
    compression: Optional[tuple] = None


def chunk_bounds(n: int, world_size: int, rank: int) -> Tuple[int, int]:
    """[start, stop) of rank's block of n elements; the first n % world_size ranks get one more."""
    if world_size < 1 or not 0 <= rank < world_size or n < 0:
        raise ValueError(
            f"chunk_bounds: need n >= 0 and 0 <= rank < world_size, got {n}, {world_size}, {rank}"
        )
    return tuple(_core.chunk_bounds(n, world_size, rank))  # type: ignore[return-value]


def root_rank(root: Any, size: int) -> int:
    if not isinstance(root, (int, np.integer)) or not 0 <= int(root) < size:
        raise ValueError(f"root must be a rank in [0, {size}), got {root!r}")
    return int(root)


def peer_rank(peer: Any, what: str, rank: int, size: int, allow_any: bool = False) -> int:
    if peer is None and allow_any:
        return -1
    if not isinstance(peer, (int, np.integer)) or not 0 <= int(peer) < size or int(peer) == rank:
        raise ValueError(
            f"{what} must be another rank in [0, {size}) than this one ({rank}), got {peer!r}"
        )
    return int(peer)


def _counts(counts: Any, n: int, what: str) -> List[int]:
    try:
        values = [int(c) for c in counts]
    except TypeError:
        raise ValueError(f"{what}: a list of {n} row counts, one per rank, is needed") from None
    if len(values) != n or any(v < 0 for v in values):
        raise ValueError(f"{what}: {n} counts >= 0 (one per rank) expected, got {values}")
    return values


def _offsets(counts: List[int]) -> List[int]:
    return [int(v) for v in np.concatenate([[0], np.cumsum(counts)[:-1]])]


# -- the collectives every rank takes part in alike ---------------------------------------
def all_reduce(x: Any, op: Any, out: Any) -> Call:
    src = input_buffer(x)
    opc = op_code(op, src.dtype)
    result, dst = output_buffer(out, src, src.shape)
    if src.ptr != dst.ptr and overlap(src, dst):
        raise ValueError(
            "out overlaps x without being x; pass out=x for in-place, or separate arrays"
        )
    return Call(_Collective.ALL_REDUCE, src, dst, opc, 0, result, (x, out))


def reduce_scatter(rank: int, size: int, x: Any, op: Any, out: Any) -> Call:
    src = input_buffer(x)
    opc = op_code(op, src.dtype)
    start, stop = chunk_bounds(src.size, size, rank)
    result, dst = output_buffer(out, src, (stop - start,))
    # In place: out is this rank's block of x.
    src = apart(src, dst, in_place_at=dst.ptr - start * src.itemsize)
    return Call(_Collective.REDUCE_SCATTER, src, dst, opc, 0, result, (x, out))


def all_gather(rank: int, size: int, x: Any, out: Any) -> Call:
    src = input_buffer(x)
    result, dst = output_buffer(out, src, (size,) + src.shape)
    # In place: x is this rank's row of out.
    src = apart(src, dst, in_place_at=dst.ptr + rank * src.nbytes)
    return Call(_Collective.ALL_GATHER, src, dst, _SUM, 0, result, (x, out))


def broadcast(rank: int, size: int, x: Any, root: Any) -> Call:
    root = root_rank(root, size)
    arr = describe(x)
    dtype_code(arr.dtype)
    if rank != root and arr.readonly:
        raise ValueError("x: the array is read-only, but broadcast writes into it")
    if arr.contiguous:
        return Call(_Collective.BROADCAST, arr, arr, _SUM, root, x, (x,))
    # Broadcast into a contiguous copy, then write it back into x (on the caller's
    # stream, for a CUDA array).
    kind, target = array_for(arr, "x")
    buf = describe(kind.contiguous(target))

    def finalize() -> None:
        if rank != root:
            kind.assign(target, buf.obj)

    return Call(_Collective.BROADCAST, buf, buf, _SUM, root, x, (x,), finalize)


def barrier() -> Call:
    return Call(_Collective.BARRIER, NOTHING, NOTHING, _SUM, 0, None, ())


# -- rooted collectives and all_to_all ----------------------------------------------------
def reduce(rank: int, size: int, x: Any, op: Any, root: Any, out: Any) -> Call:
    root = root_rank(root, size)
    src = input_buffer(x)
    opc = op_code(op, src.dtype)
    if rank == root:
        result, dst = output_buffer(out, src, src.shape)
        if src.ptr != dst.ptr and overlap(src, dst):
            raise ValueError("out overlaps x without being x; pass out=x, or separate arrays")
    else:
        result, dst = None, NOTHING
    return Call(_Collective.REDUCE, src, dst, opc, root, result, (x, out))


def gather(rank: int, size: int, x: Any, root: Any, out: Any) -> Call:
    root = root_rank(root, size)
    src = input_buffer(x)
    if rank == root:
        result, dst = output_buffer(out, src, (size,) + src.shape)
        src = apart(src, dst)
    else:
        result, dst = None, NOTHING
    return Call(_Collective.GATHER, src, dst, _SUM, root, result, (x, out))


def scatter(rank: int, size: int, x: Any, root: Any, out: Any) -> Call:
    root = root_rank(root, size)
    if rank == root:
        src = input_buffer(x)
        if len(src.shape) == 0 or src.shape[0] != size:
            raise ValueError(
                f"x: scatter's input on root has shape (world_size, ...) = ({size}, ...), "
                f"got {src.shape}"
            )
        result, dst = output_buffer(out, src, src.shape[1:])
        src = apart(src, dst)
    else:
        if out is None:
            raise ValueError(
                f"scatter: rank {rank} is not root ({root}): pass out=, an array of the "
                "block's shape and dtype, to receive into"
            )
        dst = describe(out, "out")
        dtype_code(dst.dtype, "out")
        result, dst = output_buffer(out, dst, dst.shape)
        src = dataclasses.replace(
            NOTHING,
            dtype=dst.dtype,
            itemsize=dst.itemsize,
            device=dst.device,
            stream=dst.stream,
        )
    call = Call(_Collective.SCATTER, src, dst, _SUM, root, result, (x, out))
    call.count = dst.size
    return call


def all_to_all(size: int, x: Any, out: Any, send_counts: Any, recv_counts: Any) -> Call:
    src = input_buffer(x)
    if len(src.shape) == 0:
        raise ValueError("x: all_to_all needs at least one dimension")
    row = int(np.prod(src.shape[1:], dtype=np.int64))
    if send_counts is None and recv_counts is None:
        if src.shape[0] % size:
            raise ValueError(
                f"x: first dimension {src.shape[0]} does not split into {size} equal blocks; "
                "pass send_counts and recv_counts"
            )
        result, dst = output_buffer(out, src, src.shape)
        src = apart(src, dst)
        call = Call(_Collective.ALL_TO_ALL, src, dst, _SUM, 0, result, (x, out))
        call.count = src.shape[0] // size * row
        return call
    sends = _counts(send_counts, size, "send_counts")
    recvs = _counts(recv_counts, size, "recv_counts")
    if sum(sends) != src.shape[0]:
        raise ValueError(f"send_counts add up to {sum(sends)} rows, but x has {src.shape[0]}")
    result, dst = output_buffer(out, src, (sum(recvs),) + tuple(src.shape[1:]))
    src = apart(src, dst)
    call = Call(_Collective.ALL_TO_ALL, src, dst, _SUM, 0, result, (x, out))
    call.count = 0
    call.blocks = [
        [c * row for c in sends],
        [o * row for o in _offsets(sends)],
        [c * row for c in recvs],
        [o * row for o in _offsets(recvs)],
    ]
    return call


# -- point-to-point -----------------------------------------------------------------------
def send_buffer(x: Any) -> Buffer:
    buf = input_buffer(x, "x")
    if buf.host is None:
        raise ValueError("x: send takes host memory (copy CUDA arrays to the host)")
    return buf


def recv_buffer(out: Any) -> Buffer:
    buf = describe(out, "out")
    dtype_code(buf.dtype, "out")
    if buf.host is None:
        raise ValueError("out: recv takes host memory (copy CUDA arrays to the host)")
    if buf.readonly or not buf.contiguous:
        raise ValueError("out: recv needs a writable, C-contiguous array")
    return buf
