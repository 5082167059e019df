"""Other all-reduce implementations that ``ringreduce bench --compare`` times next to ours.

Each peer wraps one system (MPI_Allreduce through mpi4py, torch.distributed's Gloo
backend) behind the same two calls the benchmark uses for ringreduce: ``bind(buf)`` returns
a function that reduces ``buf`` in place across all ranks, and ``close()``. Both systems
are timed in place because torch.distributed.all_reduce has no out-of-place form.

"window" is ringreduce itself on arrays from ``comm.empty`` (the window path, which reads
the peers' arrays in place), timed out of place like ours on numpy arrays: its function
reduces arrays of its own (``buffers``: input and output), which the benchmark fills and
checks.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from typing import Any, Callable

import numpy as np

from .. import _env
from ..launch import free_port

__all__ = ["GlooPeer", "MpiPeer", "Peer", "WindowPeer", "open_peers", "under_mpirun"]


def under_mpirun() -> bool:
    """True when this process was started by an MPI launcher."""
    return _env.launched_by_mpirun()


class Peer:
    """One comparison system: an in-place all-reduce over the same ranks as ours."""

    name = "peer"
    placement = "in-place"
    # Where bind's function takes its input and leaves its result, when not in ``buf``
    # itself (set by bind).
    buffers: tuple[np.ndarray, np.ndarray] | None = None

    def bind(self, buf: np.ndarray) -> Callable[[], None]:
        """A function that all-reduces ``buf`` in place; built outside the timed loop."""
        raise NotImplementedError

    def close(self) -> None:
        """Releases the system's communicator."""


class MpiPeer(Peer):
    """``MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, buf, op)`` through mpi4py."""

    name = "mpi"

    def __init__(self, op: str):
        from mpi4py import MPI

        ops = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}
        if op not in ops:
            raise _Unsupported(f"MPI has no {op!r} reduction")
        self._mpi = MPI
        self._op = ops[op]

    def bind(self, buf: np.ndarray) -> Callable[[], None]:
        comm, in_place, op = self._mpi.COMM_WORLD, self._mpi.IN_PLACE, self._op
        return lambda: comm.Allreduce(in_place, buf, op=op)


class GlooPeer(Peer):
    """``torch.distributed.all_reduce`` on a Gloo process group over the same ranks."""

    name = "gloo"

    def __init__(self, comm: Any, op: str, timeout: float):
        import torch
        import torch.distributed as dist

        ops = {
            "sum": dist.ReduceOp.SUM,
            "prod": dist.ReduceOp.PRODUCT,
            "min": dist.ReduceOp.MIN,
            "max": dist.ReduceOp.MAX,
        }
        if op not in ops:
            raise _Unsupported(f"torch.distributed's Gloo backend has no {op!r} reduction")
        self._torch = torch
        self._dist = dist
        self._op = ops[op]
        addr, port = _share_endpoint(comm)
        if addr.startswith("127.") or addr == "localhost":
            # Gloo binds to the address the hostname resolves to unless told otherwise,
            # which on a container may be an interface the ranks cannot reach.
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://{addr}:{port}",
            rank=comm.rank,
            world_size=comm.world_size,
            timeout=timedelta(seconds=timeout),
        )

    def bind(self, buf: np.ndarray) -> Callable[[], None]:
        if buf.dtype.name == "bfloat16":
            # torch.from_numpy does not know ml_dtypes' bfloat16; same bits, same memory.
            tensor = self._torch.from_numpy(buf.view(np.uint16)).view(self._torch.bfloat16)
        else:
            tensor = self._torch.from_numpy(buf)
        dist, op = self._dist, self._op
        return lambda: dist.all_reduce(tensor, op=op)

    def close(self) -> None:
        self._dist.destroy_process_group()


class WindowPeer(Peer):
    """ringreduce's all_reduce from one window (``comm.empty``) of buf's shape into
    another."""

    name = "window"
    placement = "out-of-place"

    def __init__(self, comm: Any, op: str):
        if comm.world_size > 1 and comm.transport != "shm":
            raise _Unsupported(f"windows need every rank on one host (transport {comm.transport})")
        self._comm, self._op = comm, op

    def bind(self, buf: np.ndarray) -> Callable[[], None]:
        comm, op = self._comm, self._op
        x, out = comm.empty(buf.shape, buf.dtype), comm.empty(buf.shape, buf.dtype)  # collective
        self.buffers = (x, out)
        return lambda: comm.all_reduce(x, op, out=out)


class _Unsupported(Exception):
    """This system cannot run the requested reduction; the text says why."""


def _share_endpoint(comm: Any) -> tuple[str, int]:
    """Rank 0 picks a free address:port for a second rendezvous and tells the others.

    The port is chosen by rank 0 rather than derived from MASTER_PORT so that it works
    under mpirun too, where there may be no MASTER_PORT. It travels as bytes in a uint8
    all-reduce (sum with zeros from the other ranks is a broadcast).
    """
    msg = np.zeros(128, dtype=np.uint8)
    if comm.rank == 0:
        addr = _env.master_addr() or _host_address()
        text = f"{addr} {free_port(addr, span=1)}".encode()
        msg[: len(text)] = np.frombuffer(text, dtype=np.uint8)
    msg = comm.all_reduce(msg, "sum")
    addr, port = bytes(msg).rstrip(b"\0").decode().split()
    return addr, int(port)


def _host_address() -> str:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def open_peers(
    names: list[str], comm: Any, op: str, timeout: float
) -> tuple[list[Peer], list[str]]:
    """Opens the requested systems; returns (peers, notes on the ones skipped and why).

    Must be called on every rank with the same arguments: every decision here depends
    only on the environment and the request, which are the same everywhere.
    """
    peers: list[Peer] = []
    notes: list[str] = []
    for name in names:
        peer: Peer | None = None
        try:
            if name == "mpi":
                if not under_mpirun():
                    raise _Unsupported(
                        "not running under mpirun; use "
                        "'mpirun -np N python -m ringreduce bench --compare mpi'"
                    )
                peer = MpiPeer(op)
            elif name == "gloo":
                peer = GlooPeer(comm, op, timeout)
            elif name == "window":
                peer = WindowPeer(comm, op)
            else:
                raise _Unsupported("unknown system (known: mpi, gloo, window)")
        except _Unsupported as exc:
            notes.append(f"{name} skipped: {exc}")
        except ImportError as exc:
            notes.append(f"{name} skipped: {exc} (pip install {_PIP[name]})")
        if peer is not None:
            peers.append(peer)
    return peers, notes


_PIP = {"mpi": "mpi4py", "gloo": "torch"}
