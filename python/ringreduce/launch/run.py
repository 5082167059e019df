"""``launch()``: runs a program as N local ranks and returns the job's exit status."""

from __future__ import annotations

import os
import queue
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from .job import _TAG, _command, _describe, _Job, _Output, _pump, _rank_env, _shell_code
from .ports import free_port

__all__ = ["launch"]


def launch(
    nprocs: int,
    cmd: Sequence[str],
    *,
    prefix: bool = True,
    env: dict[str, str] | None = None,
    master_addr: str | None = None,
    master_port: int | None = None,
    transport: str | None = None,
    grace: float = 5.0,
    nnodes: int = 1,
    node_rank: int = 0,
    keep_going: bool = False,
) -> int:
    """Runs ``cmd`` as ``nprocs`` local ranks and returns the job's exit status.

    Args:
        nprocs: number of ranks (processes) to start, at least 1.
        cmd: program and arguments; a first element ending in ``.py`` is run with the
            current interpreter.
        prefix: prefix every output line with ``"[rank] "``. Without it the ranks write
            straight to our stdout/stderr (no copying threads).
        env: extra variables for every rank, on top of ``os.environ``.
        master_addr: MASTER_ADDR for the ranks (node 0's address, where the rendezvous
            is hosted): 127.0.0.1 when None, which only a single-machine job may use.
        master_port: MASTER_PORT; a free port (whose successor is free too) when None.
        transport: if given, exported as RINGREDUCE_TRANSPORT.
        grace: seconds between SIGTERM and SIGKILL when stopping ranks.
        nnodes, node_rank: several machines, as torchrun: this machine runs ranks
            node_rank * nprocs .. node_rank * nprocs + nprocs - 1 of nnodes * nprocs; every
            machine is given the same master_addr (node 0's) and master_port.
        keep_going: a rank that fails does not stop the others (a job that survives a
            dead rank: ``Communicator.shrink``); the job succeeds when every rank that
            was not killed by a signal exits 0.

    Returns:
        0 if every rank exited 0. Otherwise the status of the first rank that failed
        (128 + signal number if it was killed by a signal), or 128 + signal number if the
        launcher itself got SIGINT/SIGTERM, or 127 if the program could not be started.
    """
    if nprocs < 1:
        raise ValueError(f"nprocs must be >= 1, got {nprocs}")
    if nnodes < 1 or not 0 <= node_rank < nnodes:
        raise ValueError(f"need nnodes >= 1 and 0 <= node_rank < nnodes, got {nnodes}, {node_rank}")
    if nnodes > 1 and master_port is None:
        raise ValueError("with several nodes every node needs the same --master-port")
    if nnodes > 1 and not master_addr:
        # Loopback would send every node's ranks to a rendezvous on their own machine,
        # where none but node 0's is hosted: they would wait out the whole timeout.
        raise ValueError("with several nodes every node needs node 0's address: --master-addr")
    if master_addr is None:
        master_addr = "127.0.0.1"
    if not cmd:
        raise ValueError("no program to launch")
    port = master_port if master_port is not None else free_port(master_addr)
    base = dict(os.environ)
    if env:
        base.update(env)
    if nnodes == 1 and not base.get("RINGREDUCE_TOKEN"):
        # A secret for this job's ranks alone: a process that does not have it cannot
        # join the rendezvous or connect to a rank. (On several nodes every launcher
        # would pick another one: set RINGREDUCE_TOKEN alike on every node instead.)
        base["RINGREDUCE_TOKEN"] = secrets.token_hex(16)
    argv = _command(cmd)
    out, err = _Output(sys.stdout), _Output(sys.stderr)
    exits: queue.Queue[tuple[int, int]] = queue.Queue()
    job = _Job(grace, first_rank=node_rank * nprocs)
    pumps: list[threading.Thread] = []
    interrupted: list[int] = []

    def on_signal(signum: int, _frame: Any) -> None:
        # Forward what we got (SIGINT lets Python ranks raise KeyboardInterrupt and
        # clean up); SIGKILL follows if they do not finish within the grace period.
        # What the ranks print from here on is their tracebacks of the interrupt, one
        # per rank: hold it back and say it once.
        if not interrupted:
            interrupted.append(signum)
            out.mute()
            err.mute()
        job.stop(signum)

    old_handlers = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            old_handlers[sig] = signal.signal(sig, on_signal)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        for rank in range(nprocs):
            pipe = subprocess.PIPE if prefix else None
            try:
                proc = subprocess.Popen(
                    argv,
                    env=_rank_env(
                        base, rank, nprocs, master_addr, port, transport, node_rank, nnodes
                    ),
                    stdout=pipe,
                    stderr=pipe,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            except OSError as exc:
                print(f"{_TAG}: cannot run {argv[0]!r}: {exc}", file=sys.stderr, flush=True)
                job.stop()
                _wait_all(job, exits, False)
                return 127
            job.procs.append(proc)
            job.alive.add(rank)
            threading.Thread(
                target=lambda r=rank, p=proc: exits.put((r, p.wait())), daemon=True
            ).start()
            if prefix:
                tag = f"[{job.first_rank + rank}] ".encode()
                for stream, sink in ((proc.stdout, out), (proc.stderr, err)):
                    t = threading.Thread(target=_pump, args=(stream, tag, sink), daemon=True)
                    t.start()
                    pumps.append(t)
        first_failure = _wait_all(job, exits, keep_going)
    finally:
        for sig, handler in old_handlers.items():
            signal.signal(sig, handler)
    # A rank's children may keep its pipes open after it exits; do not wait on them forever.
    deadline = time.monotonic() + 2.0
    for t in pumps:
        t.join(max(0.0, deadline - time.monotonic()))
    if interrupted:
        name = signal.Signals(interrupted[0]).name
        print(
            f"{_TAG}: interrupted ({name}): stopped {nprocs} ranks; their output after the "
            "signal was not shown",
            file=sys.stderr,
            flush=True,
        )
        return 128 + interrupted[0]
    if first_failure is not None:
        return _shell_code(first_failure[1]) or 1
    return 0


def _wait_all(
    job: _Job, exits: queue.Queue[tuple[int, int]], keep_going: bool
) -> tuple[int, int] | None:
    """Waits for every started rank; stops the rest when one fails (unless keep_going).
    Returns (rank, code) of the first failure not caused by us that fails the job, or
    None."""
    first: tuple[int, int] | None = None
    while job.alive:
        try:
            rank, code = exits.get(timeout=0.1)
        except queue.Empty:
            job.kill_if_overdue()
            continue
        job.alive.discard(rank)
        stopped_by_us = job.kill_at is not None
        if code != 0 and keep_going and not stopped_by_us:
            print(
                f"{_TAG}: rank {job.first_rank + rank} {_describe(code)}; the others go on "
                "(--keep-going)",
                file=sys.stderr,
                flush=True,
            )
            if first is None and code > 0:  # killed by a signal: a lost rank, not a failure
                first = (job.first_rank + rank, code)
        elif code != 0 and first is None and not stopped_by_us:
            first = (job.first_rank + rank, code)
            print(
                f"{_TAG}: rank {first[0]} {_describe(code)}; stopping the other ranks",
                file=sys.stderr,
                flush=True,
            )
            job.stop()
    if first is not None:
        print(
            f"{_TAG}: job failed: rank {first[0]} was the first to fail ({_describe(first[1])})",
            file=sys.stderr,
            flush=True,
        )
    return first
