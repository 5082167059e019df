"""Multi-process launcher: ``ringreduce launch -n N -- prog args...``.

Starts N copies of a program on this machine, one per rank, with the environment that
``ringreduce.init()`` (and ``torch.distributed``'s ``env://``) reads: RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT. On several machines, run it
once per machine with torchrun's options (``--nnodes 2 --node-rank 0 --master-addr HOST
--nproc-per-node 4``). Every output line of a rank is prefixed with ``"[rank] "`` (stdout
stays on stdout, stderr on stderr). When one rank fails, the others are stopped (SIGTERM,
then SIGKILL after a grace period) and the launcher exits with the failing rank's code, so
a broken job never leaves orphans or hangs. Ctrl-C stops every rank and prints one line.
"""

from __future__ import annotations

import argparse
import os
import queue
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import IO, Any

__all__ = ["free_port", "launch", "main"]

_TAG = "ringreduce launch"


def free_port(addr: str = "127.0.0.1", span: int = 2) -> int:
    """Returns a port p on ``addr`` such that p .. p+span-1 were all free a moment ago.

    ``span`` defaults to 2 because a launched job uses two: torch.distributed's env://
    store listens on MASTER_PORT, ringreduce's rendezvous on RINGREDUCE_PORT (the next).
    """
    for _ in range(64):
        with socket.socket() as s:
            s.bind((addr, 0))
            port = s.getsockname()[1]
        if port + span - 1 > 65535:
            continue
        if all(_port_is_free(addr, port + k) for k in range(1, span)):
            return port
    raise OSError(f"no run of {span} free ports found on {addr}")


def _port_is_free(addr: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((addr, port))
        except OSError:
            return False
    return True


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
                _wait_all(job, exits)
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
        first_failure = _wait_all(job, exits)
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


def _wait_all(job: _Job, exits: queue.Queue[tuple[int, int]]) -> tuple[int, int] | None:
    """Waits for every started rank; stops the rest when one fails. Returns (rank, code)
    of the first failure not caused by us, or None."""
    first: tuple[int, int] | None = None
    while job.alive:
        try:
            rank, code = exits.get(timeout=0.1)
        except queue.Empty:
            job.kill_if_overdue()
            continue
        job.alive.discard(rank)
        stopped_by_us = job.kill_at is not None
        if code != 0 and first is None and not stopped_by_us:
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


_EPILOG = """\
examples:
  ringreduce launch -n 4 -- python train.py --lr 0.1
  ringreduce launch --nproc-per-node 4 -- train.py       (torchrun's spelling; .py runs with
                                                          this interpreter)
  on 2 machines, node 0 at 10.0.0.1:
    ringreduce launch --nnodes 2 --node-rank 0 --nproc-per-node 4 \\
        --master-addr 10.0.0.1 --master-port 29500 -- python train.py
    ringreduce launch --nnodes 2 --node-rank 1 --nproc-per-node 4 \\
        --master-addr 10.0.0.1 --master-port 29500 -- python train.py

Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT
and RINGREDUCE_PORT = MASTER_PORT + 1 (torch.distributed's env:// store listens on
MASTER_PORT, ringreduce's rendezvous on RINGREDUCE_PORT, so both work in one job).
"""


def build_parser(prog: str = "ringreduce launch") -> argparse.ArgumentParser:
    """The argument parser of ``ringreduce launch``."""
    p = argparse.ArgumentParser(
        prog=prog,
        description="Run a program as N ranks with RANK/WORLD_SIZE/MASTER_* set.",
        usage=f"{prog} -n N [options] -- prog [args...]",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "-n",
        "--nprocs",
        "--nproc-per-node",
        "--nproc_per_node",
        dest="nprocs",
        type=int,
        required=True,
        help="ranks on this machine",
    )
    p.add_argument(
        "--nnodes", type=int, default=1, help="machines in the job (default: %(default)s)"
    )
    p.add_argument(
        "--node-rank",
        "--node_rank",
        dest="node_rank",
        type=int,
        default=0,
        help="this machine's index, 0..nnodes-1 (default: %(default)s)",
    )
    p.add_argument("--transport", help="exported as RINGREDUCE_TRANSPORT (auto, shm, tcp, mpi)")
    p.add_argument(
        "--master-addr",
        "--master_addr",
        dest="master_addr",
        help="node 0's address (needed with --nnodes > 1; default: 127.0.0.1)",
    )
    p.add_argument(
        "--master-port",
        "--master_port",
        dest="master_port",
        type=int,
        help="default: a free port (needed with --nnodes > 1)",
    )
    p.add_argument(
        "--no-prefix", action="store_true", help="do not prefix output lines with [rank]"
    )
    p.add_argument(
        "--grace",
        type=float,
        default=5.0,
        help="seconds from SIGTERM to SIGKILL when stopping ranks (default: %(default)s)",
    )
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="program and its arguments")
    return p


def main(argv: Sequence[str] | None = None, prog: str = "ringreduce launch") -> int:
    """Entry point of ``ringreduce launch``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(prog)
    # Everything after the first "--" belongs to the program, even if it looks like ours.
    if "--" in argv:
        cut = argv.index("--")
        args = parser.parse_args(argv[:cut])
        args.cmd = argv[cut + 1 :]
    else:
        args = parser.parse_args(argv)
    if not args.cmd:
        parser.error("no program given (put it after --)")
    if args.nprocs < 1:
        parser.error("-n must be at least 1")
    if args.nnodes < 1 or not 0 <= args.node_rank < args.nnodes:
        parser.error("need --nnodes >= 1 and 0 <= --node-rank < --nnodes")
    if args.nnodes > 1 and args.master_port is None:
        parser.error("with --nnodes > 1, give every node the same --master-port")
    if args.nnodes > 1 and not args.master_addr:
        parser.error("with --nnodes > 1, give every node node 0's address: --master-addr")
    return launch(
        args.nprocs,
        args.cmd,
        prefix=not args.no_prefix,
        master_addr=args.master_addr,
        master_port=args.master_port,
        transport=args.transport,
        grace=args.grace,
        nnodes=args.nnodes,
        node_rank=args.node_rank,
    )


if __name__ == "__main__":
    sys.exit(main())
