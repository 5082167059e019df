"""The ranks of a launched job as processes: their environment, their output (one
prefixed line at a time) and how to stop them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import IO, Any

_TAG = "ringreduce launch"


def _describe(code: int) -> str:
    """Human text for a Popen return code (negative means killed by that signal)."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}"
    return f"exited with code {code}"


def _shell_code(code: int) -> int:
    """The exit status a shell would report: 128 + signal for a killed process."""
    return 128 - code if code < 0 else code


class _Output:
    """Writes whole lines to one of our streams, one line at a time across threads."""

    def __init__(self, stream: IO[str]):
        self._stream = stream
        self._lock = threading.Lock()
        self._broken = False

    def mute(self) -> None:
        """Drops every later line (the ranks' pipes are still drained)."""
        with self._lock:
            self._broken = True

    def write_line(self, prefix: bytes, line: bytes) -> None:
        if not line.endswith(b"\n"):
            line += b"\n"  # a last line without newline must not glue onto another rank's
        data = prefix + line
        with self._lock:
            if self._broken:
                return
            try:
                buffer = getattr(self._stream, "buffer", None)
                if buffer is not None:
                    self._stream.flush()  # keep order with text already written to the stream
                    buffer.write(data)
                    buffer.flush()
                else:  # a text-only stream (e.g. io.StringIO in tests)
                    self._stream.write(data.decode(errors="replace"))
                    self._stream.flush()
            except (BrokenPipeError, ValueError, OSError):
                # Our reader went away (e.g. "| head"). Keep draining the rank's pipe so
                # the rank never blocks on a full pipe, but drop what it writes.
                self._broken = True


def _pump(pipe: IO[bytes], prefix: bytes, out: _Output) -> None:
    """Copies a child's pipe to our stream line by line, prefixing each line."""
    with pipe:
        for line in iter(pipe.readline, b""):
            out.write_line(prefix, line)


def _rank_env(
    base: dict[str, str],
    local_rank: int,
    nprocs: int,
    addr: str,
    port: int,
    transport: str | None,
    node_rank: int = 0,
    nnodes: int = 1,
) -> dict[str, str]:
    env = dict(base)
    env.update(
        RANK=str(node_rank * nprocs + local_rank),
        WORLD_SIZE=str(nnodes * nprocs),
        LOCAL_RANK=str(local_rank),
        LOCAL_WORLD_SIZE=str(nprocs),
        GROUP_RANK=str(node_rank),
        MASTER_ADDR=addr,
        MASTER_PORT=str(port),
        # MASTER_PORT is for torch.distributed's env:// store; ringreduce's meets next
        # to it, so that a script can use both (unless the user chose its port).
        RINGREDUCE_PORT=base.get("RINGREDUCE_PORT") or str(port + 1),
        # Prefixed lines are only useful if they arrive when printed, not at exit.
        PYTHONUNBUFFERED="1",
    )
    if transport:
        env["RINGREDUCE_TRANSPORT"] = transport
    return env


def _command(cmd: Sequence[str]) -> list[str]:
    """A ``.py`` script is run with this interpreter, as torchrun does."""
    cmd = list(cmd)
    if cmd and cmd[0].endswith(".py"):
        return [sys.executable, *cmd]
    return cmd


class _Job:
    """The running ranks, and how to stop them."""

    def __init__(self, grace: float, first_rank: int = 0):
        self.grace = grace
        # Ranks are indexed here from 0 on this machine; what we print is the job's rank
        # (RANK), which on node k of a multi-node job starts at first_rank.
        self.first_rank = first_rank
        self.procs: list[subprocess.Popen] = []
        self.alive: set = set()
        self.kill_at: float | None = None

    def ranks(self, local: Any) -> list[int]:
        """The job's ranks (RANK) of these local indices, sorted."""
        return sorted(self.first_rank + i for i in local)

    def signal_all(self, sig: int) -> None:
        # Each rank leads its own process group, so this also reaches anything it spawned.
        for rank in sorted(self.alive):
            try:
                os.killpg(self.procs[rank].pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Sends sig now and schedules SIGKILL after the grace period."""
        self.signal_all(sig)
        if self.kill_at is None:
            self.kill_at = time.monotonic() + self.grace

    def kill_if_overdue(self) -> None:
        if self.kill_at is not None and time.monotonic() >= self.kill_at and self.alive:
            print(
                f"{_TAG}: ranks {self.ranks(self.alive)} still running {self.grace:g} s after "
                "SIGTERM; sending SIGKILL",
                file=sys.stderr,
                flush=True,
            )
            self.signal_all(signal.SIGKILL)
            self.kill_at = float("inf")  # once is enough
