"""Point-to-point messages: send and recv (matched by source and tag, on links of their
own, in no order with the collectives), over a communicator (``Communicator.send`` and
``recv`` call these)."""

from __future__ import annotations

from typing import Any, Optional

from . import shaping
from .work import Deferred, Work

__all__ = ["recv", "send"]


def send(comm: Any, x: Any, dst: int, tag: int, async_op: bool) -> Any:
    """``comm.send``: x to rank dst; blocking, returns once x has left."""
    dst = shaping.peer_rank(dst, "dst", comm.rank, comm.world_size)
    buf = shaping.send_buffer(x)
    handle = comm._core.send(buf.ptr, buf.nbytes, dst, int(tag))
    return _finish(comm, handle, None, (x, buf.obj), async_op)


def recv(comm: Any, out: Any, src: Optional[int], tag: int, async_op: bool) -> Any:
    """``comm.recv``: the next message with ``tag`` from src (None: any rank) into
    ``out``; returns the sender's rank."""
    src = shaping.peer_rank(src, "src", comm.rank, comm.world_size, allow_any=True)
    buf = shaping.recv_buffer(out)
    handle = comm._core.recv(buf.ptr, buf.nbytes, src, int(tag))
    return _finish(comm, handle, Deferred(lambda: int(handle.source)), (out,), async_op)


def _finish(comm: Any, handle: Any, result: Any, keep: tuple, async_op: bool) -> Any:
    comm._keep_alive(handle, keep)
    work = Work(comm, handle, result, keep)
    return work if async_op else work.wait()
