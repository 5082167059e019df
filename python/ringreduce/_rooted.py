"""The collectives with a root (reduce, gather, scatter), all_to_all and point-to-point
send/recv of ``Communicator``, written over the same buffer path as the others."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, List, Optional, Union

import numpy as np

from . import _core
from ._buffers import Buffer, describe, dtype_code
from ._ops import ReduceOp, _op_code

_Collective = _core.Collective

# No memory: the buffer of a rank that neither sends nor receives in a call.
_NOTHING = Buffer(None, 0, (0,), "uint8", 1, -1, 0, True, False)


def _overlap(a: Buffer, b: Buffer) -> bool:
    """a and b share at least one byte."""
    return a.nbytes > 0 and b.nbytes > 0 and a.ptr < b.ptr + b.nbytes and b.ptr < a.ptr + a.nbytes


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


class _Deferred:
    """A result known only once the work is done (a receive's sender)."""

    def __init__(self, make: Callable[[], Any]):
        self.make = make


class RootedAndPointToPoint:
    """Mixed into Communicator, which provides rank, world_size, _core, _input, _output,
    _apart, _submit and _p2p."""

    def _root(self, root: Any) -> int:
        if not isinstance(root, (int, np.integer)) or not 0 <= int(root) < self.world_size:
            raise ValueError(f"root must be a rank in [0, {self.world_size}), got {root!r}")
        return int(root)

    def reduce(
        self,
        x: Any,
        op: Union[str, ReduceOp] = "sum",
        root: int = 0,
        *,
        out: Any = None,
        async_op: bool = False,
    ) -> Any:
        """Reduces x over all ranks into root: returns the result there (a new array, or
        ``out``; ``out=x`` reduces in place), None on the other ranks, whose arrays are
        left as they were.

        A ring reduce-scatter, then each rank's block to root: root receives (N-1)/N of
        x, half what all_reduce moves.
        """
        root = self._root(root)
        src = self._input(x)
        opc = _op_code(op, src.dtype)
        if self.rank == root:
            result, dst = self._output(out, src, src.shape)
            if src.ptr != dst.ptr and _overlap(src, dst):
                raise ValueError("out overlaps x without being x; pass out=x, or separate arrays")
        else:
            result, dst = None, _NOTHING
        return self._submit(_Collective.REDUCE, src, dst, opc, root, result, (x, out), async_op)

    def gather(self, x: Any, root: int = 0, *, out: Any = None, async_op: bool = False) -> Any:
        """Every rank's x on root, as an array of shape ``(world_size, *x.shape)`` (new,
        or ``out``); None on the other ranks."""
        root = self._root(root)
        src = self._input(x)
        if self.rank == root:
            result, dst = self._output(out, src, (self.world_size,) + src.shape)
            src = self._apart(src, dst)
        else:
            result, dst = None, _NOTHING
        return self._submit(
            _Collective.GATHER, src, dst, _core.Op.SUM, root, result, (x, out), async_op
        )

    def scatter(
        self, x: Any = None, root: int = 0, *, out: Any = None, async_op: bool = False
    ) -> Any:
        """Block r of root's x (shape ``(world_size, *block)``) to rank r: returns this
        rank's block (new, or ``out``). Ranks other than root pass ``out`` (which says
        the block's shape and dtype) and no x."""
        root = self._root(root)
        if self.rank == root:
            src = self._input(x)
            if len(src.shape) == 0 or src.shape[0] != self.world_size:
                raise ValueError(
                    f"x: scatter's input on root has shape (world_size, ...) = "
                    f"({self.world_size}, ...), got {src.shape}"
                )
            result, dst = self._output(out, src, src.shape[1:])
            src = self._apart(src, dst)
        else:
            if out is None:
                raise ValueError(
                    f"scatter: rank {self.rank} is not root ({root}): pass out=, an array of "
                    "the block's shape and dtype, to receive into"
                )
            dst = describe(out, "out")
            dtype_code(dst.dtype, "out")
            result, dst = self._output(out, dst, dst.shape)
            src = dataclasses.replace(
                _NOTHING, dtype=dst.dtype, itemsize=dst.itemsize, device=dst.device,
                stream=dst.stream,
            )  # fmt: skip
        return self._submit(
            _Collective.SCATTER, src, dst, _core.Op.SUM, root, result, (x, out), async_op,
            count=dst.size,
        )  # fmt: skip

    def all_to_all(
        self,
        x: Any,
        *,
        out: Any = None,
        send_counts: Optional[List[int]] = None,
        recv_counts: Optional[List[int]] = None,
        async_op: bool = False,
    ) -> Any:
        """Block r of x to rank r; returns the blocks received, in rank order.

        Without counts x's first dimension is cut into world_size equal blocks and the
        result has x's shape. With ``send_counts``/``recv_counts`` (rows of the first
        dimension for each rank, as torch's all_to_all_single splits), blocks may differ:
        the result has ``sum(recv_counts)`` rows. Every pair of ranks checks that the
        block one sends is the size the other expects (MismatchError otherwise).
        """
        src = self._input(x)
        n = self.world_size
        if len(src.shape) == 0:
            raise ValueError("x: all_to_all needs at least one dimension")
        row = int(np.prod(src.shape[1:], dtype=np.int64))
        if send_counts is None and recv_counts is None:
            if src.shape[0] % n:
                raise ValueError(
                    f"x: first dimension {src.shape[0]} does not split into {n} equal blocks; "
                    "pass send_counts and recv_counts"
                )
            result, dst = self._output(out, src, src.shape)
            src = self._apart(src, dst)
            return self._submit(
                _Collective.ALL_TO_ALL, src, dst, _core.Op.SUM, 0, result, (x, out), async_op,
                count=src.shape[0] // n * row,
            )  # fmt: skip
        sends = _counts(send_counts, n, "send_counts")
        recvs = _counts(recv_counts, n, "recv_counts")
        if sum(sends) != src.shape[0]:
            raise ValueError(f"send_counts add up to {sum(sends)} rows, but x has {src.shape[0]}")
        result, dst = self._output(out, src, (sum(recvs),) + tuple(src.shape[1:]))
        src = self._apart(src, dst)
        blocks = [
            [c * row for c in sends],
            [o * row for o in _offsets(sends)],
            [c * row for c in recvs],
            [o * row for o in _offsets(recvs)],
        ]
        return self._submit(
            _Collective.ALL_TO_ALL, src, dst, _core.Op.SUM, 0, result, (x, out), async_op,
            count=0, blocks=blocks,
        )  # fmt: skip

    # -- point-to-point -----------------------------------------------------
    def _peer(self, peer: Any, what: str, allow_any: bool = False) -> int:
        if peer is None and allow_any:
            return -1
        if (
            not isinstance(peer, (int, np.integer))
            or not 0 <= int(peer) < self.world_size
            or int(peer) == self.rank
        ):
            raise ValueError(
                f"{what} must be another rank in [0, {self.world_size}) than this one "
                f"({self.rank}), got {peer!r}"
            )
        return int(peer)

    def send(self, x: Any, dst: int, *, tag: int = 0, async_op: bool = False) -> Any:
        """Sends x to rank dst, to be taken by its ``recv`` with the same tag.

        Point-to-point messages travel on links of their own, in no order with the
        collectives; between two ranks, messages with one tag arrive in the order they
        were sent. Blocking: returns once x has left (it may not have arrived yet).
        """
        dst = self._peer(dst, "dst")
        buf = self._host_input(x, "x")
        handle = self._core.send(buf.ptr, buf.nbytes, dst, int(tag))
        return self._p2p(handle, None, (x, buf.obj), async_op)

    def recv(
        self, out: Any, src: Optional[int] = None, *, tag: int = 0, async_op: bool = False
    ) -> Any:
        """Receives into ``out`` the next message with ``tag`` from rank src (None: from
        any rank), which must be ``out``'s size. Returns the sender's rank."""
        src = self._peer(src, "src", allow_any=True)
        buf = describe(out, "out")
        dtype_code(buf.dtype, "out")
        if buf.host is None:
            raise ValueError("out: recv takes host memory (copy CUDA arrays to the host)")
        if buf.readonly or not buf.contiguous:
            raise ValueError("out: recv needs a writable, C-contiguous array")
        handle = self._core.recv(buf.ptr, buf.nbytes, src, int(tag))
        return self._p2p(handle, _Deferred(lambda: int(handle.source)), (out,), async_op)

    def _host_input(self, x: Any, what: str) -> Buffer:
        buf = self._input(x, what)
        if buf.host is None:
            raise ValueError(f"{what}: send takes host memory (copy CUDA arrays to the host)")
        return buf
