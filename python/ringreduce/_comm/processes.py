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

import functools
import os
from typing import List, NamedTuple, Optional

__all__ = ["Process", "halted", "mine", "parse"]


class Process(NamedTuple):
    pid: int
    start: str  # /proc/<pid>/stat's starttime: the same pid later is another process
    machine: str


@functools.lru_cache(maxsize=1)
def _machine() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}".replace(" ", "")
    except OSError:
        return ""


def _stat(pid: int) -> Optional[List[str]]:
    """/proc/<pid>/stat's fields from the state on (field 3), or None: no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def mine() -> str:
    """This process's entry, "pid start machine", or "" where there is no /proc."""
    fields = _stat(os.getpid())
    machine = _machine()
    if fields is None or not machine:
        return ""
    return f"{os.getpid()} {fields[19]} {machine}"


def parse(fields: List[str]) -> Optional[Process]:
    """The Process of an entry's fields (from `mine`), or None: none published."""
    if len(fields) != 3:
        return None
    try:
        return Process(int(fields[0]), fields[1], fields[2])
    except ValueError:
        return None


def halted(process: Optional[Process]) -> bool:
    """True when ``process`` is on this machine and stopped (SIGSTOP, SIGTSTP, a
    debugger's stop) or gone (exited, a zombie, or its pid now another process's).
    False when it runs, or is elsewhere (nothing can be said from here)."""
    if process is None or process.machine != _machine():
        return False
    fields = _stat(process.pid)
    if fields is None or fields[19] != process.start:
        return True
    return fields[0] in ("T", "t", "Z", "X")
