"""Work objects of the torch backend: torch's Work over ringreduce's, with futures.

``wait()`` waits on the engine directly; a future (``get_future()``, which DDP's comm
hooks and FSDP use) is completed by a small watcher thread per process group, and its
callbacks run on a pool thread, never on the engine's, so a callback may launch and
wait on further collectives (as PowerSGD does).
"""

from __future__ import annotations

import atexit
import concurrent.futures
import datetime
import queue
import threading
import time
import weakref
from typing import Any, Callable, List, Optional, Sequence

import torch
import torch.distributed as dist
from torch.futures import Future

from .._comm.core.work import wait_in_background
from ..errors import TimeoutError


def _as_torch_sees_it(exc: BaseException) -> BaseException:
    """The engine's error, with a timeout worded as torch's backends word it ("Timed
    out"), which scripts and torch's own tests look for; same class, same ``peer``."""
    if isinstance(exc, TimeoutError) and " Timed out " not in str(exc):
        seconds = getattr(exc, "seconds", None)
        worded = type(exc)(f"ringreduce: Timed out waiting on another rank; {exc}")
        worded.peer = exc.peer
        if seconds is not None:
            worded.seconds = seconds
        return worded
    return exc


# ---- completion of futures ----------------------------------------------------------

_callbacks = concurrent.futures.ThreadPoolExecutor(
    max_workers=4, thread_name_prefix="ringreduce-future"
)
_STOP_SECONDS = 10.0  # the longest a group's shutdown (or the exit) waits for its watcher


class _Watcher:
    """One thread per process group that waits for works whose futures were asked for,
    in the order they were asked for, and completes each future on a pool thread.

    It is a daemon thread (a group never destroyed must not keep the program alive),
    so it is stopped and waited for when its group shuts down, and at exit for groups
    never destroyed: a daemon thread that comes back from a wait in the engine while
    the interpreter finalises is ended by force inside C++ frames, which aborts the
    process after its work is done ("terminate called without an active exception",
    as torch's Gloo workers do; docs/troubleshooting.md)."""

    def __init__(self) -> None:
        self._queue: queue.Queue = queue.Queue()
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()
        _watchers.add(self)

    def watch(self, work: _Work) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="ringreduce-watcher", daemon=True
                )
                self._thread.start()
        self._queue.put(work)

    def _run(self) -> None:
        # This thread waits on the caller's behalf: the calls it waits for run on the
        # engine's worker, overlapping the caller's computation, not here.
        wait_in_background()
        while True:
            work = self._queue.get()
            if work is None:
                return
            try:
                work._wait_engine()
                error = None
            except BaseException as exc:  # the future carries it to whoever waits
                error = exc
            try:
                _callbacks.submit(work._complete_future, error)
            except RuntimeError:  # the pool is shut down: the interpreter is exiting
                work._complete_future(error)

    def stop(self, timeout: float = _STOP_SECONDS) -> None:
        """Ends the thread once the works queued before are done, and waits for it (at
        most ``timeout`` seconds: a work that never ends is bounded by its own timeout)."""
        with self._lock:
            thread, self._thread = self._thread, None
            if thread is None:
                return
            self._queue.put(None)
        if thread is not threading.current_thread():
            thread.join(timeout)


_watchers: weakref.WeakSet[_Watcher] = weakref.WeakSet()


@atexit.register
def _stop_watchers() -> None:
    # atexit runs before finalisation, while a thread may still take the GIL.
    for watcher in list(_watchers):
        watcher.stop()


class _Work(dist._Work):
    """A torch Work over ringreduce Works: ``wait()`` finishes them, then runs
    ``finish`` (copies out of staging buffers) once; ``result()`` is the outputs."""

    # Defaults as class attributes: a blocking call's Work is made for every call, and
    # each attribute set in __init__ costs.
    _finish: Optional[Callable[[], None]] = None
    _source: Optional[Callable[[], int]] = None
    _done = False
    _error: Optional[BaseException] = None
    _future: Optional[Future] = None

    def __init__(
        self,
        pg: Any,
        works: Sequence[Any],
        outputs: List[torch.Tensor],
        finish: Optional[Callable[[], None]] = None,
        source: Optional[Callable[[], int]] = None,
    ):
        super().__init__()
        self._pg = pg
        self._works = works
        self._outputs = outputs
        if finish is not None:
            self._finish = finish
        if source is not None:
            self._source = source
        self._lock = threading.Lock()

    def _wait_parts(self) -> None:
        for w in self._works:
            w.wait()
        if self._finish is not None:
            self._finish()

    def _wait_engine(self) -> None:
        with self._lock:
            if self._done:
                if self._error is not None:
                    raise self._error
                return
            try:
                self._wait_parts()
            except BaseException as exc:
                self._error = _as_torch_sees_it(exc)
                raise self._error from None
            finally:
                self._done = True

    def _complete_future(self, error: Optional[BaseException]) -> None:
        fut = self._future
        if fut is None or fut.done():
            return
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(self._outputs)

    def wait(self, timeout: Any = datetime.timedelta(0)) -> bool:
        """Finishes the work (raising its error). A non-zero ``timeout`` (timedelta or
        seconds) bounds this wait only: on expiry TimeoutError ("Timed out") is raised and
        the work keeps running, so ``wait()`` may be called again. Zero: the group's
        timeout governs, as on Gloo."""
        seconds = timeout.total_seconds() if hasattr(timeout, "total_seconds") else timeout
        if seconds and seconds > 0 and not self._done:
            limit = time.monotonic() + float(seconds)
            pause = 1e-4
            while not all(w.done() for w in self._works):
                if time.monotonic() >= limit:
                    raise TimeoutError(
                        f"ringreduce: Timed out after {float(seconds):g} s in Work.wait(timeout) "
                        f"on rank {self._pg.rank()}; the operation is still running"
                    )
                time.sleep(pause)
                pause = min(2 * pause, 0.005)
        self._wait_engine()
        return True

    def is_completed(self) -> bool:
        return self._done or all(w.done() for w in self._works)

    def is_success(self) -> bool:
        if not self.is_completed():
            raise RuntimeError("ringreduce: is_success() asked before the work completed")
        try:
            self._wait_engine()
        except Exception:
            return False
        return True

    def exception(self) -> Optional[BaseException]:
        return self._error

    def source_rank(self) -> int:
        if self._source is None:
            raise ValueError("source_rank() is defined for recv from any source only")
        self._wait_engine()
        return self._source()

    _source_rank = source_rank  # what torch.distributed.recv calls

    def result(self) -> List[torch.Tensor]:
        self._wait_engine()
        return self._outputs

    def synchronize(self) -> None:
        self._wait_engine()

    def get_future(self) -> Future:
        with self._lock:
            if self._future is None:
                self._future = Future()
                if self._done:
                    done_now = True
                else:
                    done_now = False
            else:
                return self._future
        if done_now:
            self._complete_future(self._error)
        else:
            self._pg._watcher.watch(self)
        return self._future


class _Finished(dist._Work):
    """The Work of a call that finished before it was returned (a blocking one, or one
    with nothing to do): torch's ``wait()`` on it costs no more than a method call.
    Made by `_finished` (no ``__init__`` of its own: a Python frame per call costs)."""

    _outputs: List[torch.Tensor] = []

    def wait(self, timeout: Any = None) -> bool:
        return True

    def _wait_engine(self) -> None:
        """(As `_Work`'s, for a `_Chain` of parts.)"""

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def exception(self) -> Optional[BaseException]:
        return None

    def result(self) -> List[torch.Tensor]:
        return self._outputs

    def synchronize(self) -> None:
        pass

    def source_rank(self) -> int:
        raise ValueError("source_rank() is defined for recv from any source only")

    _source_rank = source_rank

    def get_future(self) -> Future:
        fut: Future = Future()
        fut.set_result(self._outputs)
        return fut


def _finished(outputs: List[torch.Tensor]) -> _Finished:
    """A finished Work whose result is ``outputs``."""
    work = _Finished()
    work._outputs = outputs
    return work


def _done_work(pg: Any, outputs: List[torch.Tensor]) -> _Finished:
    return _finished(outputs)


class _Chain(_Work):
    """Several Works as one (coalesced calls)."""

    def __init__(self, pg: Any, works: List[_Work], outputs: List[torch.Tensor]):
        super().__init__(pg, [], outputs)
        self._parts = works

    def _wait_parts(self) -> None:
        for w in self._parts:
            w._wait_engine()

    def is_completed(self) -> bool:
        return self._done or all(w.is_completed() for w in self._parts)
