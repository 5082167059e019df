"""Point-to-point messages, as methods of Communicator: send and recv (matched by
source and tag, on links of their own, in no order with the collectives)."""

from __future__ import annotations

from typing import Any, Callable, Optional

from . import shaping
from .work import Deferred, Work

__all__ = ["PointToPoint"]


class PointToPoint:
    """Communicator's send and recv (a mixin: ``_core`` and ``_keep_alive`` are the
    communicator's)."""

    _core: Any
    _keep_alive: Callable[[Any, tuple], None]
    rank: int
    world_size: int

    def send(self, x: Any, dst: int, *, tag: int = 0, async_op: bool = False) -> Any:
        """Sends x to rank dst, to be taken by its ``recv`` with the same tag.

        Point-to-point messages travel on links of their own, in no order with the
        collectives; between two ranks, messages with one tag arrive in the order they
        were sent. Blocking: returns once x has left (it may not have arrived yet).
        """
        dst = shaping.peer_rank(dst, "dst", self.rank, self.world_size)
        buf = shaping.send_buffer(x)
        handle = self._core.send(buf.ptr, buf.nbytes, dst, int(tag))
        return self._p2p(handle, None, (x, buf.obj), async_op)

    def recv(
        self, out: Any, src: Optional[int] = None, *, tag: int = 0, async_op: bool = False
    ) -> Any:
        """Receives into ``out`` the next message with ``tag`` from rank src (None: from
        any rank), which must be ``out``'s size. Returns the sender's rank."""
        src = shaping.peer_rank(src, "src", self.rank, self.world_size, allow_any=True)
        buf = shaping.recv_buffer(out)
        handle = self._core.recv(buf.ptr, buf.nbytes, src, int(tag))
        return self._p2p(handle, Deferred(lambda: int(handle.source)), (out,), async_op)

    def _p2p(self, handle: Any, result: Any, keep: tuple, async_op: bool) -> Any:
        self._keep_alive(handle, keep)
        work = Work(self, handle, result, keep)
        return work if async_op else work.wait()
