"""Whether another rank's process on this machine is stopped or gone, read from /proc.

A rank stopped by SIGSTOP or a debugger still has its sockets: its standby store accepts
connections (the kernel answers for it) and never replies, so the survivors' agreement
could only wait for it: for ``connect`` seconds to learn that the agreement's host does
not answer, then a grace for a suspected rank that may still be on its way. On the
rank's own machine /proc says at once that it is stopped, and the agreement of a revoked
communicator counts it dead (`membership`). Each rank publishes its pid, its start time
(so that a pid reused by another process is not taken for it) and its machine (boot id
and pid namespace: where its pid means that process).
"""

from __future__ import annotations

from typing import List, NamedTuple, Optional

from ... import _core

__all__ = ["Process", "halted", "mine", "parse"]


class Process(NamedTuple):
    pid: int
    start: int  # /proc/<pid>/stat's starttime: the same pid later is another process
    machine: str  # a digest of the boot id and pid namespace, in hex


def mine() -> str:
    """This process's entry, "pid start machine", or "" where there is no /proc."""
    me = _core.this_process()
    return "" if me is None else " ".join(str(field) for field in me)


def parse(fields: List[str]) -> Optional[Process]:
    """The Process of an entry's fields (from `mine`), or None: none published."""
    if len(fields) != 3:
        return None
    try:
        return Process(int(fields[0]), int(fields[1]), fields[2])
    except ValueError:
        return None


def halted(process: Optional[Process]) -> bool:
    """True when ``process`` is on this machine and stopped (SIGSTOP, SIGTSTP, a
    debugger's stop) or gone (exited, a zombie, or its pid now another process's).
    False when it runs, or is elsewhere (nothing can be said from here). The same test
    as the rendezvous store's client makes of its host (csrc/common/process_state.h)."""
    if process is None or not 0 < process.pid < 2**32 or not 0 <= process.start < 2**64:
        return False
    return _core.process_halted(process.pid, process.start, process.machine)
