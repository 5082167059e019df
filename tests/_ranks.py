"""Run test code on N real rank processes.

`RankGroup(n)` spawns n processes that each create a communicator (TCP
transport, rendezvous on a free loopback port) and then serve calls: `group.run(fn,
*args)` runs ``fn(comm, *args)`` on every rank and returns the list of per-rank
results, re-raising the first rank's exception (with its traceback text) if any
rank failed. ``fn`` must be a module-level function so it can be pickled by
reference. Every wait has a deadline, so a broken test fails instead of hanging.

`run_ranks(n, fn, *args)` is a one-shot group, for tests that break the
communicator on purpose (killed ranks, mismatches, timeouts).
"""

from __future__ import annotations

import contextlib
import faulthandler
import multiprocessing as mp
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import traceback
from typing import Any, Callable, Dict, List, Optional


def _context():
    """Rank processes are forks of a server that has imported numpy and ringreduce once
    (forkserver), not fresh interpreters that import them each time (spawn): a few ms to
    start a rank instead of half a second of CPU. The server forks before any
    communicator (and so any engine thread) exists in it."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["numpy", "ringreduce", "_ranks"])
    return ctx


_CTX = _context()
# Fresh interpreters, for tests that read what ranks write to stderr (capfd): a
# forkserver's children inherit the server's stderr, not the test's.
SPAWN = mp.get_context("spawn")


def free_port() -> int:
    """A TCP port that was free on loopback a moment ago, outside the ephemeral range
    (see ringreduce.launch.ports: an ephemeral port can be taken by any connect)."""
    from ringreduce.launch.ports import free_port as pick

    return pick("127.0.0.1", span=1)


class RankFailure(AssertionError):
    """A rank raised; carries every rank's outcome."""

    def __init__(self, message: str, outcomes: list):
        super().__init__(message)
        self.outcomes = outcomes


# What RankGroup(transport=...) asks ringreduce for: the transport argument of
# init(), and how many emulated hosts the ranks are split over (0: no split).
TRANSPORTS = {
    "tcp": ("tcp", 0),
    "shm": ("shm", 0),
    # Two emulated hosts (RINGREDUCE_HOST_ID): shared memory inside each, TCP
    # between them, in one communicator.
    "shm+tcp": ("auto", 2),
    # Shared memory only, asked for across two emulated hosts: an error.
    "shm-split": ("shm", 2),
}


def take_parent_env(init_kwargs: dict) -> None:
    """Gives this rank process the environment its parent had when it made the group, as
    spawn would (a forkserver's children start with the server's). A rank's own
    variables go on top, after this."""
    parent_env = init_kwargs.pop("parent_env", None)
    if parent_env is not None:
        os.environ.clear()
        os.environ.update(parent_env)


_STACKS: Any = None  # a rank's open stacks file (faulthandler writes to it)


def _native_stacks(pids: List[int], seconds: float = 45.0) -> Dict[int, str]:
    """Every thread's C/C++ stack in each process of ``pids``, where gdb is installed (a
    rank stuck outside Python, in a destructor or a lock in the engine or in torch, shows
    no Python frame): one gdb per process, all at once, within ``seconds`` in all."""
    gdb = shutil.which("gdb")
    if gdb is None or not pids:
        return {pid: "" for pid in pids}
    cmd = [gdb, "-batch", "-nx", "-ex", "thread apply all bt 25", "-p"]
    runs = {}
    for pid in pids:
        try:
            runs[pid] = subprocess.Popen(
                [*cmd, str(pid)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        except OSError as exc:
            runs[pid] = exc
    deadline = time.monotonic() + seconds
    # The interpreter's own frames (its eval loop) say nothing the Python stacks do not.
    inner = re.compile(r" at (Python|Objects|Modules|\./Include)/")
    texts = {}
    for pid, run in runs.items():
        if isinstance(run, OSError):
            texts[pid] = f"\n(gdb could not start: {run})"
            continue
        try:
            out, err = run.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            run.kill()
            run.communicate()
            texts[pid] = f"\n(gdb gave no stacks within {seconds:.0f} s)"
            continue
        lines = [
            ln[:240]
            for ln in out.splitlines()
            if ln.startswith(("Thread ", "#")) and not inner.search(ln)
        ]
        if not lines:  # e.g. ptrace forbids attaching (kernel.yama.ptrace_scope)
            texts[pid] = "\n(gdb read no stacks: " + " ".join(err.split())[-400:] + ")"
        else:
            texts[pid] = "\nits native stacks (gdb):\n" + "\n".join(lines)[-12000:]
    return texts


def stacks_path(pid: int) -> str:
    """Where rank process ``pid`` writes its threads' Python stacks on SIGUSR2."""
    return os.path.join(tempfile.gettempdir(), f"ringreduce-test-stacks-{pid}.txt")


def _serve(rank: int, size: int, port: int, conn, init_kwargs: dict) -> None:
    # A rank that hangs can be asked where it is (RankGroup dumps it into the failure).
    global _STACKS
    _STACKS = open(stacks_path(os.getpid()), "w")  # noqa: SIM115 - lives as long as the rank
    faulthandler.register(signal.SIGUSR2, file=_STACKS, all_threads=True)
    take_parent_env(init_kwargs)
    os.environ.update(init_kwargs.pop("env", {}))
    transport, hosts = TRANSPORTS[init_kwargs.pop("transport", "tcp")]
    if hosts:
        os.environ["RINGREDUCE_HOST_ID"] = f"emulated-host-{rank * hosts // size}"
    import ringreduce as rr

    if port == 0:
        # Rank 0 listens on a port the kernel picks and tells the parent, which starts
        # the others with it: no probing for a free port that something else takes first.
        from ringreduce._comm import bootstrap as _bootstrap

        _bootstrap.port_ready = lambda chosen: conn.send(("port", chosen, ""))
    try:
        comm = rr.init(
            transport,
            rank=rank,
            world_size=size,
            master_addr="127.0.0.1",
            master_port=port,
            **init_kwargs,
        )
    except BaseException as exc:  # report, don't hang the parent
        conn.send(("err", exc, traceback.format_exc()))
        return
    conn.send(("ok", None, ""))
    while True:
        if not conn.poll(1800):
            return  # the parent went away (or forgot us: conftest revives dead groups)
        msg = conn.recv()
        if msg is None:
            break
        fn, args = msg
        try:
            conn.send(("ok", fn(comm, *args), ""))
        except BaseException as exc:
            try:
                conn.send(("err", exc, traceback.format_exc()))
            except Exception:  # the exception itself could not be pickled
                conn.send(("err", RuntimeError(repr(exc)), traceback.format_exc()))
    comm.close()


class RankGroup:
    """n rank processes sharing one communicator. ``transport`` (a key of TRANSPORTS,
    default "tcp") says which links carry the data."""

    def __init__(
        self,
        n: int,
        *,
        timeout: float = 60.0,
        target: Callable = _serve,
        context: Any = None,
        **init_kwargs: Any,
    ):
        """target: what each rank process runs (_serve, or a variant that sets the rank
        up first and then calls it); context: how rank processes start (default: forked
        from the preloaded server; SPAWN where a test reads their stderr with capfd)."""
        self.n = n
        self._target = target
        self._context = context or _CTX
        init_kwargs.setdefault("timeout", timeout)
        init_kwargs["parent_env"] = dict(os.environ)
        self.procs = []
        self.conns = []
        # Rank 0 first, on port 0; the others once it says which port it got (a file
        # store or a world of one needs no port: every rank at once).
        needs_port = n > 1 and not init_kwargs.get("store_dir")
        self.port = 0 if needs_port else 1
        self._start(0, init_kwargs)
        early = None
        if needs_port:
            early = self._collect_one(0, timeout + 30)
            if early[0] == "port":
                self.port, early = early[1], None
        if early is None:
            for rank in range(1, n):
                self._start(rank, init_kwargs)
            outcomes = self._collect(timeout + 30)
        else:  # rank 0 failed before it listened: nobody to meet
            never = ("err", RuntimeError("not started: rank 0 failed first"), "")
            outcomes = [early] + [never] * (n - 1)
        self._raise_if_failed(outcomes, "init")

    def _start(self, rank: int, init_kwargs: dict) -> None:
        parent, child = self._context.Pipe()
        p = self._context.Process(
            target=self._target,
            args=(rank, self.n, self.port, child, dict(init_kwargs)),
            daemon=True,
        )
        p.start()
        self.procs.append(p)
        self.conns.append(parent)

    def _collect_one(self, rank: int, timeout: float) -> tuple:
        conn = self.conns[rank]
        if not conn.poll(timeout):
            return ("hung", None, f"rank {rank} gave no answer in {timeout:.0f} s")
        try:
            return conn.recv()
        except EOFError:
            return ("dead", None, f"rank {rank} exited")

    def _collect(self, timeout: float) -> list:
        deadline = time.monotonic() + timeout
        outcomes: list = [None] * self.n
        for rank in range(len(self.conns)):
            outcomes[rank] = self._collect_one(rank, max(0.0, deadline - time.monotonic()))
        hung = [r for r, o in enumerate(outcomes) if o[0] == "hung"]
        stacks = self._stacks(hung)
        for rank in hung:
            status, value, text = outcomes[rank]
            outcomes[rank] = (status, value, text + stacks[rank])
        if hung:
            # Its ranks are still inside the call: no later test can use this group (the
            # conftest starts a new one once these are gone).
            for p in self.procs:
                p.kill()
            for p in self.procs:
                p.join(10)
        return outcomes

    def _stacks(self, ranks: List[int]) -> Dict[int, str]:
        """Where each hung rank's threads are: as faulthandler prints them, then (gdb)
        their native stacks."""
        pids = {rank: self.procs[rank].pid for rank in ranks}
        for pid in pids.values():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGUSR2)
        if pids:
            time.sleep(1.0)
        native = _native_stacks(list(pids.values()))
        texts = {}
        for rank, pid in pids.items():
            try:
                with open(stacks_path(pid)) as f:
                    text = "\nits threads, when it was given up:\n" + f.read()[-6000:]
            except OSError as exc:
                text = f"\n(its threads could not be dumped: {exc})"
            texts[rank] = text + native[pid]
        return texts

    def _raise_if_failed(self, outcomes: list, what: str) -> None:
        bad = [(r, o) for r, o in enumerate(outcomes) if o[0] != "ok"]
        if bad:
            text = "\n".join(f"--- rank {r} ({o[0]}):\n{o[2]}" for r, o in bad)
            raise RankFailure(f"{what} failed on ranks {[r for r, _ in bad]}:\n{text}", outcomes)

    def run(self, fn: Callable, *args: Any, timeout: float = 120.0) -> list:
        """Runs fn(comm, *args) on every rank; returns the per-rank results."""
        for conn in self.conns:
            conn.send((fn, args))
        outcomes = self._collect(timeout)
        self._raise_if_failed(outcomes, getattr(fn, "__name__", "call"))
        return [o[1] for o in outcomes]

    def outcomes(self, fn: Callable, *args: Any, timeout: float = 120.0) -> list:
        """Like run(), but returns ("ok"|"err"|"dead"|"hung", value_or_exc, tb) per rank."""
        for conn in self.conns:
            try:
                conn.send((fn, args))
            except (BrokenPipeError, OSError):
                pass
        return self._collect(timeout)

    def alive(self) -> bool:
        """Every rank process is still there to serve calls."""
        return all(p.is_alive() for p in self.procs)

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        for p in self.procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join(5)
            if p.pid is not None:
                with contextlib.suppress(OSError):
                    os.remove(stacks_path(p.pid))

    def kill(self, rank: int) -> None:
        """SIGKILLs one rank (failure tests)."""
        os.kill(self.procs[rank].pid, 9)
        self.procs[rank].join(5)

    def __enter__(self) -> RankGroup:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def run_ranks(
    n: int,
    fn: Callable,
    *args: Any,
    timeout: float = 120.0,
    init_timeout: Optional[float] = None,
    **init_kwargs: Any,
) -> list:
    """One-shot: spawn n ranks, run fn(comm, *args) on each, return per-rank outcomes."""
    if init_timeout is not None:
        init_kwargs["timeout"] = init_timeout
    with RankGroup(n, **init_kwargs) as group:
        return group.outcomes(fn, *args, timeout=timeout)


def survivors(
    n: int,
    fn: Callable,
    victim: int,
    transport: str = "shm",
    env: Optional[dict] = None,
    args: tuple = (),
) -> dict:
    """Runs fn(comm, victim, *args) on n ranks (timeout 60 s; ``env`` set on each), of
    which ``victim`` kills itself; checks that it died and that every other rank
    returned, and gives {rank: what fn returned} for the survivors."""
    with RankGroup(n, timeout=60, transport=transport, env=env or {}) as group:
        outcomes = group.outcomes(fn, victim, *args, timeout=120)
    values = {}
    for rank, (status, value, tb) in enumerate(outcomes):
        if rank == victim:
            assert status == "dead", (status, tb)
        else:
            assert status == "ok", tb
            values[rank] = value
    return values


def run_scripts(
    script: str, argv_of: Callable[[int], list], n: int, victim: int = -1, timeout: float = 120.0
) -> dict:
    """Runs ``python script *argv_of(rank)`` for ranks 0..n-1 and returns {rank: the JSON
    of its last output line}. Every rank must exit 0, except ``victim``, which must
    die by SIGKILL (and reports nothing)."""
    import json
    import subprocess
    import sys

    procs = [
        subprocess.Popen(
            [sys.executable, script, *map(str, argv_of(r))],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(n)
    ]
    reports = {}
    try:
        for r, p in enumerate(procs):
            out, err = p.communicate(timeout=timeout)
            if r == victim:
                assert p.returncode == -9, err[-2000:]
                continue
            assert p.returncode == 0, f"rank {r} exited {p.returncode}:\n{err[-3000:]}"
            reports[r] = json.loads(out.strip().splitlines()[-1])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return reports


@contextlib.contextmanager
def native_stderr():
    """What the engine writes to stderr (file descriptor 2) inside the block, such as
    RINGREDUCE_DEBUG's lines: `with native_stderr() as said: ...; said()` is the text."""
    saved = os.dup(2)
    captured = tempfile.TemporaryFile(mode="w+b")
    text: List[str] = []
    os.dup2(captured.fileno(), 2)
    try:
        yield lambda: text[0]
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        captured.seek(0)
        text.append(captured.read().decode(errors="replace"))
        captured.close()
