"""The Python face of the engine: init(), Communicator and Work."""

from __future__ import annotations

import enum
import os
import time
from typing import Any, Callable, List, Optional, Tuple, Union

import numpy as np

from . import _core, _device
from ._buffers import (
    FLOATING,
    address,
    as_array,
    check_output,
    dtype_code,
    wrap_like,
)
from ._env import launched_by_mpirun, master_address, rank_and_size
from .errors import TimeoutError

__all__ = ["ReduceOp", "Communicator", "Work", "init", "chunk_bounds", "build_info"]

# Collective codes shared with csrc/algorithms/collective.h.
_ALL_REDUCE, _REDUCE_SCATTER, _ALL_GATHER, _BROADCAST, _BARRIER = 1, 2, 3, 4, 5

# Default pipelining unit: large enough to amortize per-segment overhead,
# small enough that reducing one segment overlaps the arrival of the next.
_DEFAULT_SEGMENT_BYTES = 1 << 20


class ReduceOp(enum.Enum):
    """Reduction operators. Strings ("sum", "avg", ...) are accepted too."""

    SUM = 0
    PROD = 1
    MIN = 2
    MAX = 3
    AVG = 4  # floating dtypes only


def _op_code(op: Union[str, ReduceOp], dtype_name: str) -> int:
    if isinstance(op, ReduceOp):
        member = op
    elif isinstance(op, str) and op.upper() in ReduceOp.__members__:
        member = ReduceOp[op.upper()]
    else:
        raise ValueError(f"op: unknown reduction {op!r}; use one of sum, prod, min, max, avg")
    if member is ReduceOp.AVG and dtype_name not in FLOATING:
        raise ValueError(
            f"op: avg is defined for floating dtypes only, not {dtype_name} "
            "(use sum and divide, choosing your own rounding)"
        )
    return member.value


def chunk_bounds(n: int, world_size: int, rank: int) -> Tuple[int, int]:
    """[start, stop) of rank's block of n elements; the first n % world_size ranks get one more."""
    if world_size < 1 or not 0 <= rank < world_size or n < 0:
        raise ValueError(
            f"chunk_bounds: need n >= 0 and 0 <= rank < world_size, got {n}, {world_size}, {rank}"
        )
    return tuple(_core.chunk_bounds(n, world_size, rank))  # type: ignore[return-value]


def build_info() -> dict:
    """What this build contains: version, mpi, cuda, transports, cpu_kernels."""
    return dict(_core.build_info())


class Work:
    """An in-flight collective. ``wait()`` returns its result; ``done()`` polls."""

    def __init__(
        self,
        comm: Communicator,
        handle: Any,
        result: Any,
        keep: tuple,
        finalize: Optional[Callable[[], None]] = None,
    ):
        self._comm = comm
        self._handle = handle
        self._result = result
        self._keep: Optional[tuple] = keep
        self._finalize = finalize
        self._finished = False

    def wait(self, timeout: Optional[float] = None) -> Any:
        """Blocks until the collective completes and returns its result.

        ``timeout`` bounds this wait only (the collective itself gives up after the
        communicator's timeout without progress); on expiry ``TimeoutError`` is raised and
        the collective keeps running, so ``wait()`` may be called again.
        """
        if not self._finished:
            # Wait in short slices so Ctrl-C reaches Python promptly; the C++ wait
            # releases the GIL, so other threads run meanwhile.
            limit = None if timeout is None else time.monotonic() + float(timeout)
            finished = False
            while not finished:
                left = 0.2 if limit is None else min(0.2, limit - time.monotonic())
                finished = self._handle.wait(max(left, 0.0))
                if limit is not None and time.monotonic() >= limit:
                    break
            if not finished:
                exc = TimeoutError(
                    f"rank {self._comm.rank}: {self._handle.description} has not finished "
                    f"after waiting {timeout} s; it is still running"
                )
                raise exc
            self._finished = True
            if self._finalize is not None:
                self._finalize()
            self._keep = None
        return self._result

    def done(self) -> bool:
        """True once the collective has finished (successfully or not)."""
        return self._finished or bool(self._handle.done())

    def __repr__(self) -> str:
        state = "done" if self.done() else "pending"
        return f"<ringreduce.Work {self._handle.description} {state}>"


class Communicator:
    """A group of ranks that run collectives together. Create with ``ringreduce.init()``."""

    def __init__(self, core: Any, transport: str):
        self._core = core
        self._transport = transport
        # Arrays of async calls whose Work the caller may have dropped: the
        # engine still writes into them, so they must stay alive until done.
        self._inflight: List[Tuple[Any, tuple]] = []

    @classmethod
    def from_mpi(
        cls, mpi4py_comm: Any, *, timeout: float = 60.0, transport: str = "mpi"
    ) -> Communicator:
        """Wraps an mpi4py intracommunicator: ``COMM_WORLD`` or any sub-communicator.

        The result's ranks and world size are those of ``mpi4py_comm``. Collective:
        every rank of ``mpi4py_comm`` must call it. Our traffic runs on a private
        duplicate, so it never matches the program's own messages. With
        ``transport="tcp"`` the MPI communicator only serves to meet (rank 0
        hosts the TCP store) and the collectives run over TCP sockets.
        ``timeout`` bounds every wait on a peer, in seconds.
        """
        from . import _mpi

        if not timeout or timeout <= 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        segment = int(os.environ.get("RINGREDUCE_SEGMENT_BYTES", _DEFAULT_SEGMENT_BYTES))
        if transport == "mpi":
            comm = cls(_mpi.create_from_mpi4py(mpi4py_comm, float(timeout), segment), "mpi")
            _mpi.track(comm)
            return comm
        if transport == "tcp":
            host, port = _mpi.tcp_rendezvous(mpi4py_comm, float(timeout))
            core = _core.Communicator.create_tcp(
                mpi4py_comm.Get_rank(),
                mpi4py_comm.Get_size(),
                host,
                port,
                float(timeout),
                segment,
                "",
            )
            return cls(core, "tcp")
        raise ValueError(f"transport must be 'mpi' or 'tcp', got {transport!r}")

    # -- properties -------------------------------------------------------
    @property
    def rank(self) -> int:
        """This process's rank, 0 <= rank < world_size."""
        return int(self._core.rank)

    @property
    def world_size(self) -> int:
        """Number of ranks."""
        return int(self._core.world_size)

    @property
    def transport(self) -> str:
        """ "tcp" or "mpi"."""
        return self._transport

    @property
    def timeout(self) -> float:
        """Seconds any wait on a peer may go without progress before TimeoutError."""
        return float(self._core.timeout)

    def stats(self) -> dict:
        """Counters: bytes_sent, bytes_received (payload and headers), ops (collectives done)."""
        return dict(self._core.stats())

    # -- plumbing ---------------------------------------------------------
    def _submit(
        self,
        kind: int,
        send: np.ndarray,
        recv: np.ndarray,
        count: int,
        code: int,
        op: int,
        root: int,
        result: Any,
        keep: tuple,
        async_op: bool,
        finalize: Optional[Callable[[], None]] = None,
        device: int = -1,
        stream: int = 0,
    ) -> Any:
        self._inflight = [(h, k) for h, k in self._inflight if not h.done()]
        handle = self._core.submit(
            kind, address(send), address(recv), count, code, op, root, device=device, stream=stream
        )
        keep = keep + (send, recv)
        self._inflight.append((handle, keep))
        work = Work(self, handle, result, keep, finalize)
        return work if async_op else work.wait()

    # -- collectives ------------------------------------------------------
    def all_reduce(
        self, x: Any, op: Union[str, ReduceOp] = "sum", *, out: Any = None, async_op: bool = False
    ) -> Any:
        """Reduces x over all ranks; every rank gets the result (new array, or ``out``).

        ``out=x`` reduces in place. Non-contiguous x is copied first; ``out`` must be
        C-contiguous and writable.
        """
        if _device.involves_device(x, out):
            return _device.all_reduce(self, x, op, out, async_op)
        arr = as_array(x, "x")
        code = dtype_code(arr, "x")
        opc = _op_code(op, arr.dtype.name)
        if out is None:
            src = np.ascontiguousarray(arr)
            dst = np.empty_like(src)
            result: Any = wrap_like(x, dst)
        else:
            dst = as_array(out, "out")
            check_output(dst, dtype=arr.dtype, shape=arr.shape)
            src = arr if (out is x and arr.flags.c_contiguous) else np.ascontiguousarray(arr)
            _check_no_partial_overlap(src, dst)
            result = out
        return self._submit(
            _ALL_REDUCE, src, dst, src.size, code, opc, 0, result, (x, out), async_op
        )

    def reduce_scatter(
        self, x: Any, op: Union[str, ReduceOp] = "sum", *, out: Any = None, async_op: bool = False
    ) -> Any:
        """Reduces x over all ranks; returns this rank's block of the flattened result.

        The block is ``chunk_bounds(x.size, world_size, rank)``; the result is 1-D.
        """
        if _device.involves_device(x, out):
            return _device.reduce_scatter(self, x, op, out, async_op)
        arr = as_array(x, "x")
        code = dtype_code(arr, "x")
        opc = _op_code(op, arr.dtype.name)
        src = np.ascontiguousarray(arr)
        start, stop = chunk_bounds(src.size, self.world_size, self.rank)
        if out is None:
            dst = np.empty(stop - start, dtype=arr.dtype)
            result: Any = wrap_like(x, dst)
        else:
            dst = as_array(out, "out")
            check_output(dst, dtype=arr.dtype, shape=(stop - start,))
            result = out
        return self._submit(
            _REDUCE_SCATTER, src, dst, src.size, code, opc, 0, result, (x, out), async_op
        )

    def all_gather(self, x: Any, *, out: Any = None, async_op: bool = False) -> Any:
        """Gathers x from every rank into an array of shape ``(world_size, *x.shape)``."""
        if _device.involves_device(x, out):
            return _device.all_gather(self, x, out, async_op)
        arr = as_array(x, "x")
        code = dtype_code(arr, "x")
        src = np.ascontiguousarray(arr)
        shape = (self.world_size,) + tuple(arr.shape)
        if out is None:
            dst = np.empty(shape, dtype=arr.dtype)
            result: Any = wrap_like(x, dst)
        else:
            dst = as_array(out, "out")
            check_output(dst, dtype=arr.dtype, shape=shape)
            result = out
        return self._submit(_ALL_GATHER, src, dst, src.size, code, 0, 0, result, (x, out), async_op)

    def broadcast(self, x: Any, root: int = 0, *, async_op: bool = False) -> Any:
        """Fills x in place, on every rank, with root's x. Returns x."""
        if not isinstance(root, (int, np.integer)) or not 0 <= int(root) < self.world_size:
            raise ValueError(f"root must be a rank in [0, {self.world_size}), got {root!r}")
        if _device.involves_device(x):
            return _device.broadcast(self, x, int(root), async_op)
        arr = as_array(x, "x")
        code = dtype_code(arr, "x")
        if self.rank != root and not arr.flags.writeable:
            raise ValueError("x: the array is read-only, but broadcast writes into it")
        finalize = None
        if arr.flags.c_contiguous:
            buf = arr
        else:
            # Broadcast into a contiguous copy, then write back in place.
            buf = np.ascontiguousarray(arr)

            def finalize() -> None:
                if self.rank != root:
                    arr[...] = buf

        return self._submit(
            _BROADCAST, buf, buf, buf.size, code, 0, int(root), x, (x,), async_op, finalize
        )

    def barrier(self) -> None:
        """Returns once every rank has called barrier()."""
        empty = np.empty(0, dtype=np.uint8)
        self._submit(_BARRIER, empty, empty, 0, 5, 0, 0, None, (), False)

    # -- lifetime ---------------------------------------------------------
    def close(self) -> None:
        """Finishes queued collectives, then closes every connection. Idempotent."""
        self._core.close()
        self._inflight.clear()

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"<ringreduce.Communicator rank={self.rank} world_size={self.world_size} "
            f"transport={self.transport!r}>"
        )


def _check_no_partial_overlap(src: np.ndarray, dst: np.ndarray) -> None:
    if address(src) != address(dst) and np.may_share_memory(src, dst):
        raise ValueError(
            "out overlaps x without being x; pass out=x for in-place, or separate arrays"
        )


def init(
    transport: str = "auto",
    *,
    rank: Optional[int] = None,
    world_size: Optional[int] = None,
    master_addr: Optional[str] = None,
    master_port: Optional[int] = None,
    timeout: float = 60.0,
    store_dir: Optional[str] = None,
) -> Communicator:
    """Joins the job and returns its communicator.

    rank/world_size default to the launcher's environment (RANK/WORLD_SIZE,
    OMPI_COMM_WORLD_*, PMI_*, SLURM_*); MASTER_ADDR/MASTER_PORT locate rank 0's
    rendezvous store (``store_dir``: use a shared directory instead). ``timeout``
    bounds every wait on a peer, in seconds.

    ``transport``: "tcp", "mpi" (MPI_COMM_WORLD; needs the MPI build), or "auto"
    (the RINGREDUCE_TRANSPORT variable if set, else "mpi" when launched by mpirun and
    MPI support loads, else "tcp"). "tcp" under mpirun without MASTER_ADDR meets
    over MPI (mpi4py): rank 0 picks the address and a free port.
    """
    env_transport = os.environ.get("RINGREDUCE_TRANSPORT")
    if transport == "auto" and env_transport:
        transport = env_transport
    if transport not in ("auto", "tcp", "mpi"):
        raise ValueError(f"transport must be 'auto', 'tcp' or 'mpi', got {transport!r}")
    if not timeout or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    segment = int(os.environ.get("RINGREDUCE_SEGMENT_BYTES", _DEFAULT_SEGMENT_BYTES))
    from . import _mpi  # imports the MPI extension only when MPI is asked for

    if transport == "auto":
        transport = "mpi" if (launched_by_mpirun() and _mpi.available()) else "tcp"
    if transport == "mpi":
        # MPI knows every rank: no rendezvous. rank/world_size, if given, must agree.
        core = _mpi.create_world(float(timeout), segment)
        comm = Communicator(core, "mpi")
        _mpi.track(comm)
        mine = (comm.rank, comm.world_size)
        if any(v is not None and int(v) != m for v, m in zip((rank, world_size), mine)):
            comm.close()
            raise ValueError(
                f"rank={rank}, world_size={world_size} disagree with MPI_COMM_WORLD "
                f"(rank {comm.rank} of {comm.world_size}); leave them out with transport='mpi'"
            )
        return comm
    r, n = rank_and_size(rank, world_size)
    if n < 1 or not 0 <= r < n:
        raise ValueError(f"rank {r} is not in [0, world_size={n})")
    if (
        master_addr is None
        and "MASTER_ADDR" not in os.environ
        and not store_dir
        and rank is None
        and world_size is None
        and n > 1
        and launched_by_mpirun()
        and _mpi.have_mpi4py()
    ):
        # Under mpirun without MASTER_ADDR: agree on rank 0's address over MPI.
        from mpi4py import MPI

        r, n = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
        host, port = _mpi.tcp_rendezvous(MPI.COMM_WORLD, float(timeout))
        if master_port is not None:
            port = int(master_port)
    else:
        host, port = master_address(master_addr, master_port)
    core = _core.Communicator.create_tcp(r, n, host, port, float(timeout), segment, store_dir or "")
    return Communicator(core, "tcp")
