"""Which thread issues a communicator's collectives: ranks pair calls in the order each
issues them, so two threads must never race, nor take turns in different orders on
different ranks (see `Communicator`'s note on threads)."""

from __future__ import annotations

import functools
import hashlib
import re
import threading
from typing import Any, Optional

from ... import _core
from ...errors import ConcurrentUseError, MismatchError


class Issuer:
    """Which thread is issuing a collective on one communicator, to catch two at once.

    The gate itself is the engine's (``_core.IssueGate``), so that the fast path of
    ``all_reduce`` passes it without a round trip through Python; this keeps the
    threads' names and writes the messages.

    ``wait``: a second thread waits for its turn instead (for callers that order their
    calls themselves, as torch.distributed's contract has them do)."""

    def __init__(self, core: Any, wait: bool):
        self.gate = _core.IssueGate(core, wait)
        self._core = core
        self._rank = int(core.rank)
        self._wait = wait
        self._thread: Optional[threading.Thread] = None
        self._kind: Any = None
        self._tagged: Any = None  # (thread, name) whose tag the engine has
        self._names: dict = {}  # tag -> name, of the threads that issued calls here
        self._conflict: Optional[str] = None

    @property
    def conflict(self) -> Optional[str]:
        """Why this communicator refuses every collective; None until it does (then it
        is never cleared)."""
        return self._conflict

    @conflict.setter
    def conflict(self, why: str) -> None:
        self._conflict = why
        self.gate.set_conflict(self.message())

    def enter(self, kind: Any) -> None:
        me = threading.current_thread()
        if self._conflict is None:
            code = -1 if kind is None else int(kind)
            got = self.gate.enter_wait(code) if self._wait else self.gate.try_enter(code)
            if got == 0:
                self._thread, self._kind = me, kind
                if not self._wait and self._tagged != (me, me.name):
                    # Every call's header carries its thread's tag, so that threads
                    # taking turns in a different order on another rank are caught
                    # (queue_threads: the caller orders its threads' calls itself).
                    tag = _thread_tag(me.name)
                    try:
                        self._core.set_issuer(tag)
                    except BaseException:
                        self.leave()
                        raise
                    self._tagged = (me, me.name)
                    # The fast path runs on this thread only while its name is the
                    # one tagged: a renamed thread comes back here first.
                    self.gate.tagged = 0
                    if len(self._names) < 256:
                        self._names[tag] = me.name
                if self._tagged == (me, me.name):
                    self.gate.tagged = me.ident or 0
                return
            other, other_kind = self._holder()
            self.conflict = (
                "two threads used this communicator at once: "
                + (f"thread {_name(me)} called {_call(kind)} while ")
                + (
                    f"thread {_name(other)} was issuing {_call(other_kind)}"
                    if other is not me
                    else f"its own {_call(other_kind)} was still being issued (a signal handler?)"
                )
            )
        raise ConcurrentUseError(self.message())

    def _holder(self) -> tuple:
        """The thread in the gate and its call's kind (the fast path records only the
        thread's ident and the kind's number)."""
        ident, code = self.gate.owner, self.gate.owner_kind
        thread = next((t for t in threading.enumerate() if t.ident == ident), None)
        if thread is None and self._thread is not None and self._thread.ident == ident:
            thread = self._thread
        kind = None if code < 0 else _core.Collective(code)
        return thread, kind

    def explain(self, error: BaseException) -> Optional[ConcurrentUseError]:
        """A ConcurrentUseError naming both threads, if ``error`` is the engine's report
        that a call was issued by another thread on a neighbour rank; else None."""
        if not isinstance(error, MismatchError) or error.reason != "thread":
            return None
        tags = dict(zip(error.ranks or (), error.issuers or ()))
        others = [r for r in tags if r != self._rank]
        if self._rank not in tags or len(others) != 1:
            return None
        peer = others[0]
        names = dict(self._names)
        names.update((_thread_tag(t.name), t.name) for t in threading.enumerate())
        theirs, mine = (
            repr(names[t]) if t in names else f"<no thread of that name here, tag {t:#018x}>"
            for t in (tags[peer], tags[self._rank])
        )
        if self.conflict is None:
            self.conflict = (
                f"threads took turns in a different order on two ranks: rank {peer} issued "
                f"the call from thread {theirs} where this rank issued it from thread {mine} "
                f"(the engine's check: {error})"
            )
        exc = ConcurrentUseError(self.message())
        exc.peer = peer
        return exc

    def leave(self) -> None:
        self._thread = self._kind = None
        self.gate.leave()

    def message(self) -> str:
        return (
            f"rank {self._rank}: {self.conflict}. "
            "Ranks pair collectives in the order each one issues them, so calls from two "
            "threads may pair with the other thread's call on another rank and combine its "
            "data; this communicator now refuses every collective. Issue collectives from "
            "one thread at a time in the same order on every rank, or give each thread a "
            "communicator of its own"
        )


@functools.lru_cache(maxsize=1024)
def _thread_tag(name: str) -> int:
    """The 64-bit tag of a thread's name, compared across ranks by the call header.
    Python's default names count every thread the process made ("Thread-7 (work)",
    "Dummy-3"), which may differ between ranks: the count is left out."""
    role = re.sub(r"^(Thread|Dummy)-\d+", r"\1", name)
    return int.from_bytes(hashlib.blake2b(role.encode(), digest_size=8).digest(), "little") or 1


def _name(thread: Optional[threading.Thread]) -> str:
    return "?" if thread is None else f"{thread.name!r} (ident {thread.ident})"


def _call(kind: Any) -> str:
    return "a collective" if kind is None else getattr(kind, "name", str(kind)).lower()
