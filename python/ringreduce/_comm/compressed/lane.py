"""The lane: the compressed calls the engine does not take, in the background, in the
order they were issued.

A compressed call with a built-in codec on host arrays is one engine collective
(csrc/algorithms/one_hop.h), queued on the engine's worker like any other, and so is an
exact call that sends a residual along. The calls the engine does not take run hop.py's
chain in Python (encode, an all_to_all, decode-sum-encode, an all_gather, decode):
codecs with methods of their own, "gather" codecs, device arrays (device.py); and auto's
timed calibration. Each step's buffers are made by the one before, so the engine's
queue cannot hold the chain. With ``async_op=True`` such a call goes to its
communicator's lane: one thread, named alike on every rank, that runs them one after the
other, so that their codec work and exchanges overlap the computation that goes on
meanwhile.

Ranks pair calls in the order each issues them, and the program's order must stay the
one the engine sees:

- every call (compressed or not) issued while the lane holds work waits until it is
  empty before it goes in (`Communicator._issue`, `route._call`; the fast path of
  all_reduce declines while the lane holds work, through the gate's ``divert``). So
  call numbers, auto's decisions and the canary's schedule are made in the program's
  order on every rank;
- which thread issues a call depends on the call alone (an async call the engine does
  not take: the lane; anything else: the caller), never on how far a rank's lane has
  got: call headers carry the issuing thread's tag, and one call issued from two
  different threads on two ranks is refused as concurrent use.

The thread exits when the lane is empty, and is started again by the next call; it is
not a daemon, so a program that ends without waiting still finishes its calls (each is
bounded by the communicator's timeout).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any, Callable, Deque, Optional, Tuple

from ...errors import TimeoutError

__all__ = ["Lane", "LaneWork"]

THREAD_NAME = "ringreduce-lane"  # the same on every rank: call headers carry its tag


class LaneWork:
    """The Work of a compressed call in the lane: ``wait()`` returns its result (or
    raises its error), ``done()`` polls."""

    def __init__(self, comm: Any, what: str):
        self._comm = comm
        self._what = what
        self._done = threading.Event()
        self._result: Any = None
        self._error: Optional[BaseException] = None

    def _finish(self, result: Any, error: Optional[BaseException]) -> None:
        self._result, self._error = result, error
        self._done.set()

    def wait(self, timeout: Optional[float] = None) -> Any:
        """Blocks until the call has run and returns its result. ``timeout`` bounds this
        wait only: on expiry TimeoutError is raised and the call goes on, so ``wait()``
        may be called again. Ctrl-C abandons the call (and the communicator, as with
        every collective: the peers raise PeerError naming this rank)."""
        limit = None if timeout is None else time.monotonic() + float(timeout)
        try:
            # Short slices, so that Ctrl-C reaches the main thread promptly.
            while not self._done.wait(0.2):
                if limit is not None and time.monotonic() >= limit:
                    raise TimeoutError(
                        f"rank {self._comm.rank}: compressed {self._what} has not finished "
                        f"after waiting {timeout} s; it is still running"
                    )
        except KeyboardInterrupt:
            self._comm._core.interrupt()
            raise
        if self._error is not None:
            raise self._error.with_traceback(None)
        return self._result

    def done(self) -> bool:
        """True once the call has run (successfully or not)."""
        return self._done.is_set()

    def is_completed(self) -> bool:
        """The same as `done` (torch.distributed's name for it)."""
        return self.done()

    def __repr__(self) -> str:
        state = "done" if self.done() else "pending"
        return f"<ringreduce.LaneWork compressed {self._what} {state}>"


class Lane:
    """One communicator's lane (see the module)."""

    def __init__(self, gate: Any):
        self._gate = gate  # the communicator's IssueGate: its fast path declines meanwhile
        self._cv = threading.Condition()
        self._jobs: Deque[Tuple[Callable[[], Any], LaneWork]] = deque()
        self._thread: Optional[threading.Thread] = None  # running jobs; None when empty

    @property
    def busy(self) -> bool:
        """Whether the lane holds work (queued or running)."""
        return self._thread is not None

    def here(self) -> bool:
        """Whether the calling thread is the lane's."""
        return threading.current_thread() is self._thread

    def submit(self, job: Callable[[], Any], work: LaneWork) -> LaneWork:
        """Queues ``job`` (its result or error goes to ``work``) behind the lane's
        others, starting the thread if need be."""
        with self._cv:
            self._jobs.append((job, work))
            if self._thread is None:
                self._gate.divert = True
                self._thread = threading.Thread(target=self._run, name=THREAD_NAME)
                try:
                    self._thread.start()
                except BaseException:  # no thread (at interpreter exit): nothing queued
                    self._jobs.clear()
                    self._thread = None
                    self._gate.divert = False
                    raise
        return work

    def drain(self) -> None:
        """Waits until the lane is empty (its calls are bounded by the communicator's
        timeout, so this is too). From the lane's own thread: returns at once."""
        if self._thread is None or self.here():
            return
        with self._cv:
            while self._thread is not None:
                self._cv.wait(0.2)  # slices: Ctrl-C reaches the main thread

    def _run(self) -> None:
        while True:
            with self._cv:
                if not self._jobs:
                    self._thread = None
                    self._gate.divert = False
                    self._cv.notify_all()
                    return
                job, work = self._jobs.popleft()
            try:
                result = job()
            except BaseException as exc:  # noqa: BLE001 - the waiter raises it
                work._finish(None, exc)
            else:
                work._finish(result, None)
