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

import multiprocessing as mp
import os
import socket
import time
import traceback
from typing import Any, Callable, Optional


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
    """A TCP port that was free on loopback a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


def _serve(rank: int, size: int, port: int, conn, init_kwargs: dict) -> None:
    take_parent_env(init_kwargs)
    os.environ.update(init_kwargs.pop("env", {}))
    transport, hosts = TRANSPORTS[init_kwargs.pop("transport", "tcp")]
    if hosts:
        os.environ["RINGREDUCE_HOST_ID"] = f"emulated-host-{rank * hosts // size}"
    import ringreduce as rr

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

    def __init__(self, n: int, *, timeout: float = 60.0, **init_kwargs: Any):
        self.n = n
        self.port = free_port()
        init_kwargs.setdefault("timeout", timeout)
        init_kwargs["parent_env"] = dict(os.environ)
        self.procs = []
        self.conns = []
        for rank in range(n):
            parent, child = _CTX.Pipe()
            p = _CTX.Process(
                target=_serve, args=(rank, n, self.port, child, init_kwargs), daemon=True
            )
            p.start()
            self.procs.append(p)
            self.conns.append(parent)
        outcomes = self._collect(timeout + 30)
        self._raise_if_failed(outcomes, "init")

    def _collect(self, timeout: float) -> list:
        deadline = time.monotonic() + timeout
        outcomes: list = [None] * self.n
        for rank, conn in enumerate(self.conns):
            left = max(0.0, deadline - time.monotonic())
            if conn.poll(left):
                try:
                    outcomes[rank] = conn.recv()
                except EOFError:
                    outcomes[rank] = ("dead", None, f"rank {rank} exited")
            else:
                outcomes[rank] = ("hung", None, f"rank {rank} gave no answer in {timeout:.0f} s")
        return outcomes

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
