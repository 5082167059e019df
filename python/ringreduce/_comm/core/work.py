"""Work: a collective or point-to-point operation in flight."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Optional

from ...errors import MismatchError, RingReduceError, TimeoutError

__all__ = ["Deferred", "Work", "wait_in_background"]

# Threads that wait for work on someone's behalf (the torch backend's future watcher):
# there a wait must not run the queued call itself, which would turn the worker's
# polite waits, meant to overlap the caller's computation, into this thread's eager ones.
_background = threading.local()


def wait_in_background() -> None:
    """Marks the calling thread as a background waiter: its `Work.wait` calls leave
    queued collectives to the engine's worker instead of running them here."""
    _background.on = True


class Deferred:
    """A result known only once the work is done (a receive's sender)."""

    def __init__(self, make: Callable[[], Any]):
        self.make = make


class Work:
    """An in-flight collective. ``wait()`` returns its result; ``done()`` polls."""

    def __init__(
        self,
        comm: Any,  # the Communicator (a room above this one)
        handle: Any,
        result: Any,
        keep: tuple,
        finalize: Optional[Callable[[], None]] = None,
    ):
        self._comm = comm
        self._handle = handle
        self._result = result  # or a Deferred that makes it once the work is done
        self._keep: Optional[tuple] = keep
        self._finalize = finalize
        self._finished = False

    def wait(self, timeout: Optional[float] = None) -> Any:
        """Blocks until the collective completes and returns its result.

        ``timeout`` bounds this wait only (the collective itself gives up after the
        communicator's timeout without progress); on expiry ``TimeoutError`` is raised and
        the collective keeps running, so ``wait()`` may be called again.
        """
        if not self._finished:
            # Wait in short slices so Ctrl-C reaches Python promptly; the C++ wait
            # releases the GIL, so other threads run meanwhile.
            limit = None if timeout is None else time.monotonic() + float(timeout)
            finished = False
            while not finished:
                left = 0.2 if limit is None else min(0.2, limit - time.monotonic())
                try:
                    if getattr(_background, "on", False):
                        finished = self._handle.wait(max(left, 0.0))
                    else:
                        # A collective still queued runs here (the engine's wait).
                        finished = self._comm._core.wait(self._handle, max(left, 0.0))
                except MismatchError as exc:
                    self._comm._revoke(exc)
                    explained = self._comm._issuer.explain(exc)
                    if explained is None:
                        raise
                    raise explained from exc
                except RingReduceError as exc:
                    raise self._comm._revoke(exc)  # noqa: B904 - the same error, or its PeerError
                except KeyboardInterrupt:
                    # Ctrl-C: the collective is abandoned where it runs, on the worker,
                    # which tells the peers (PeerError naming this rank there).
                    self._comm._core.interrupt()
                    raise
                if limit is not None and time.monotonic() >= limit:
                    break
            if not finished:
                raise TimeoutError(
                    f"rank {self._comm.rank}: {self._handle.description} has not finished "
                    f"after waiting {timeout} s; it is still running"
                )
            self._finished = True
            if self._finalize is not None:
                self._finalize()
            self._keep = None
            if isinstance(self._result, Deferred):
                self._result = self._result.make()
        return self._result

    def done(self) -> bool:
        """True once the collective has finished (successfully or not)."""
        return self._finished or bool(self._handle.done())

    def is_completed(self) -> bool:
        """The same as `done` (torch.distributed's name for it)."""
        return self.done()

    def __repr__(self) -> str:
        state = "done" if self.done() else "pending"
        return f"<ringreduce.Work {self._handle.description} {state}>"
