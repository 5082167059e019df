"""The Python face of the engine: Communicator, Work and ReduceOp.

Every collective is written once: its arrays, wherever they live (host memory or a
GPU), become `Buffer` descriptors (`_buffers.describe`), results are allocated like
the input by the input's `ArrayKind`, and the call goes to the engine as pointers.
"""

from __future__ import annotations

import dataclasses
import enum
import time
from typing import Any, Callable, List, Optional, Tuple, Union

import numpy as np

from . import _composite, _core
from ._arrays import array_for, kind_of
from ._buffers import FLOATING, Buffer, describe, dtype_code
from ._env import engine_options
from .errors import TimeoutError

__all__ = ["ReduceOp", "Communicator", "Work", "chunk_bounds", "build_info"]

_Collective = _core.Collective


class ReduceOp(enum.Enum):
    """Reduction operators. Strings ("sum", "avg", ...) are accepted too."""

    SUM = int(_core.Op.SUM)
    PROD = int(_core.Op.PROD)
    MIN = int(_core.Op.MIN)
    MAX = int(_core.Op.MAX)
    AVG = int(_core.Op.AVG)  # floating dtypes only


# torch.distributed.ReduceOp names for ours.
_TORCH_OPS = {"SUM": "SUM", "PRODUCT": "PROD", "MIN": "MIN", "MAX": "MAX", "AVG": "AVG"}


def _op_member(op: Any) -> ReduceOp:
    if isinstance(op, ReduceOp):
        return op
    if isinstance(op, str) and op.upper() in ReduceOp.__members__:
        return ReduceOp[op.upper()]
    # torch.distributed.ReduceOp.SUM and friends, without importing torch.
    name = getattr(op, "name", None)
    if type(op).__module__.startswith("torch") and name in _TORCH_OPS:
        return ReduceOp[_TORCH_OPS[name]]
    raise ValueError(
        f"op: unknown reduction {op!r}; use one of sum, prod, min, max, avg (strings, "
        "rr.ReduceOp or torch.distributed.ReduceOp)"
    )


def _op_code(op: Any, dtype_name: str) -> Any:
    member = _op_member(op)
    if member is ReduceOp.AVG and dtype_name not in FLOATING:
        raise ValueError(
            f"op: avg is defined for floating dtypes only, not {dtype_name} "
            "(use sum and divide, choosing your own rounding)"
        )
    return _core.Op(member.value)


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


# No memory: the buffer of a rank that neither sends nor receives in a call.
_NOTHING = Buffer(None, 0, (0,), "uint8", 1, -1, 0, True, False)


def _overlap(a: Buffer, b: Buffer) -> bool:
    return a.ptr < b.ptr + b.nbytes and b.ptr < a.ptr + a.nbytes


def _counts(counts: Any, n: int, what: str) -> List[int]:
    try:
        values = [int(c) for c in counts]
    except TypeError:
        raise ValueError(f"{what}: a list of {n} row counts, one per rank, is needed") from None
    if len(values) != n or any(v < 0 for v in values):
        raise ValueError(f"{what}: {n} counts >= 0 (one per rank) expected, got {values}")
    return values


def _offsets(counts: List[int]) -> List[int]:
    return [int(v) for v in np.concatenate([[0], np.cumsum(counts)[:-1]])]


class _Deferred:
    """A result known only once the work is done (a receive's sender)."""

    def __init__(self, make: Callable[[], Any]):
        self.make = make


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
        self._result = result  # or a callable that makes it once the work is done
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
                raise TimeoutError(
                    f"rank {self._comm.rank}: {self._handle.description} has not finished "
                    f"after waiting {timeout} s; it is still running"
                )
            self._finished = True
            if self._finalize is not None:
                self._finalize()
            self._keep = None
            if isinstance(self._result, _Deferred):
                self._result = self._result.make()
        return self._result

    def done(self) -> bool:
        """True once the collective has finished (successfully or not)."""
        return self._finished or bool(self._handle.done())

    def is_completed(self) -> bool:
        """The same as `done` (torch.distributed's name for it)."""
        return self.done()

    def __repr__(self) -> str:
        state = "done" if self.done() else "pending"
        return f"<ringreduce.Work {self._handle.description} {state}>"


class Communicator:
    """A group of ranks that run collectives together. Create with ``ringreduce.init()``."""

    def __init__(self, core: Any):
        self._core = core
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
        duplicate, so it never matches the program's own messages. ``transport="auto"``
        puts the ranks of one host on shared memory and the rest on MPI. With
        ``transport="tcp"`` (or "shm") the MPI communicator only serves to meet (rank 0
        hosts the TCP store) and the collectives run over sockets (or shared memory).
        ``timeout`` bounds every wait on a peer, in seconds.
        """
        from . import _mpi

        if not timeout or timeout <= 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        if transport not in ("mpi", "tcp", "shm", "auto"):
            raise ValueError(f"transport must be 'mpi', 'tcp', 'shm' or 'auto', got {transport!r}")
        options = engine_options(transport, timeout)
        if transport in ("mpi", "auto"):
            comm = cls(_mpi.create_from_mpi4py(mpi4py_comm, options))
            _mpi.track(comm)
            return comm
        return cls(_mpi.create_tcp(mpi4py_comm, options))

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
    def local_rank(self) -> int:
        """This process's place among the ranks of its host, 0 <= local_rank < local_world_size."""
        return int(self._core.local_rank)

    @property
    def local_world_size(self) -> int:
        """Number of ranks on this process's host."""
        return int(self._core.local_world_size)

    @property
    def transport(self) -> str:
        """What carries the data: "tcp", "mpi", "shm", "shm+tcp" or "shm+mpi"."""
        return str(self._core.transport)

    @property
    def timeout(self) -> float:
        """Seconds any wait on a peer may go without progress before TimeoutError."""
        return float(self._core.timeout)

    def stats(self) -> dict:
        """Counters: bytes_sent, bytes_received (payload and headers), ops (collectives
        done), small_message_ops (all_reduce calls that took the small-message path)."""
        return dict(self._core.stats())

    # -- arguments --------------------------------------------------------
    def _input(self, x: Any, what: str = "x") -> Buffer:
        """x's Buffer, of a supported dtype; a contiguous copy when x is not contiguous."""
        buf = describe(x, what)
        dtype_code(buf.dtype, what)
        if not buf.contiguous:
            if buf.host is None and kind_of(buf.obj) is None:
                raise ValueError(
                    f"{what}: the CUDA array is not C-contiguous; pass a contiguous one "
                    "(ringreduce makes contiguous copies of torch tensors and cupy arrays only)"
                )
            kind, arr = array_for(buf, what)
            buf = describe(kind.contiguous(arr), what)
        return buf

    def _output(self, out: Any, like: Buffer, shape: Tuple[int, ...]) -> Tuple[Any, Buffer]:
        """(result, its Buffer): ``out`` checked against what the call writes, or a new
        array allocated like the input."""
        if out is None:
            kind, arr = array_for(like, "out")
            result = kind.empty(arr, shape)
            return result, describe(result, "out")
        buf = describe(out, "out")
        if buf.device != like.device:
            raise ValueError(
                f"out is in {buf.where} but x is in {like.where}; pass both on the same "
                "device, or both on the host"
            )
        if buf.dtype != like.dtype:
            raise TypeError(f"out: dtype {buf.dtype} does not match the input's {like.dtype}")
        if buf.shape != tuple(shape):
            raise ValueError(f"out: shape {buf.shape} does not match the expected {tuple(shape)}")
        if buf.readonly:
            raise ValueError("out: the array is read-only")
        if not buf.contiguous:
            raise ValueError("out: the array must be C-contiguous (results are written in place)")
        return out, buf

    def _submit(
        self,
        kind: Any,
        send: Buffer,
        recv: Buffer,
        op: Any,
        root: int,
        result: Any,
        keep: tuple,
        async_op: bool,
        finalize: Optional[Callable[[], None]] = None,
        count: Optional[int] = None,
        blocks: Optional[list] = None,
    ) -> Any:
        code = dtype_code(send.dtype)
        count = send.size if count is None else count
        extra = {} if blocks is None else {"blocks": blocks}
        if not async_op:
            # On this thread when nothing is queued: no hand-off to the worker.
            self._core.run(
                kind, send.ptr, recv.ptr, count, code, op, root, send.device, send.stream, **extra
            )
            if finalize is not None:
                finalize()
            return result
        self._inflight = [(h, k) for h, k in self._inflight if not h.done()]
        handle = self._core.submit(
            kind, send.ptr, recv.ptr, count, code, op, root, send.device, send.stream, **extra
        )
        keep = keep + (send.obj, recv.obj)
        self._inflight.append((handle, keep))
        return Work(self, handle, result, keep, finalize)

    # -- collectives ------------------------------------------------------
    def all_reduce(
        self, x: Any, op: Union[str, ReduceOp] = "sum", *, out: Any = None, async_op: bool = False
    ) -> Any:
        """Reduces x over all ranks; every rank gets the result (new array, or ``out``).

        ``out=x`` reduces in place. Non-contiguous x is copied first; ``out`` must be
        C-contiguous and writable, and in the same memory (host or GPU) as x.
        """
        if not async_op and type(x) is np.ndarray:
            # The common case, checked and run in C++; None when it needs this path.
            result = self._core.all_reduce_numpy(x, out, op)
            if result is not None:
                return result
        src = self._input(x)
        opc = _op_code(op, src.dtype)
        result, dst = self._output(out, src, src.shape)
        if src.ptr != dst.ptr and src.ptr < dst.ptr + dst.nbytes and dst.ptr < src.ptr + src.nbytes:
            raise ValueError(
                "out overlaps x without being x; pass out=x for in-place, or separate arrays"
            )
        return self._submit(_Collective.ALL_REDUCE, src, dst, opc, 0, result, (x, out), async_op)

    def reduce_scatter(
        self, x: Any, op: Union[str, ReduceOp] = "sum", *, out: Any = None, async_op: bool = False
    ) -> Any:
        """Reduces x over all ranks; returns this rank's block of the flattened result.

        The block is ``chunk_bounds(x.size, world_size, rank)``; the result is 1-D.
        """
        src = self._input(x)
        opc = _op_code(op, src.dtype)
        start, stop = chunk_bounds(src.size, self.world_size, self.rank)
        result, dst = self._output(out, src, (stop - start,))
        return self._submit(
            _Collective.REDUCE_SCATTER, src, dst, opc, 0, result, (x, out), async_op
        )

    def all_gather(
        self, x: Any, *, out: Any = None, async_op: bool = False, uneven: bool = False
    ) -> Any:
        """Gathers x from every rank into an array of shape ``(world_size, *x.shape)``.

        With ``uneven=True`` the first dimension of x may differ between ranks (as in
        Horovod's allgather or MPI_Allgatherv): the result is every rank's x
        concatenated along the first axis, in rank order (blocking; no ``out``).
        """
        if uneven:
            if out is not None or async_op:
                raise ValueError("all_gather(uneven=True) takes neither out nor async_op")
            return _composite.all_gather_uneven(self, x)
        src = self._input(x)
        result, dst = self._output(out, src, (self.world_size,) + src.shape)
        return self._submit(
            _Collective.ALL_GATHER, src, dst, _core.Op.SUM, 0, result, (x, out), async_op
        )

    def broadcast(self, x: Any, root: int = 0, *, async_op: bool = False) -> Any:
        """Fills x in place, on every rank, with root's x. Returns x."""
        if not isinstance(root, (int, np.integer)) or not 0 <= int(root) < self.world_size:
            raise ValueError(f"root must be a rank in [0, {self.world_size}), got {root!r}")
        root = int(root)
        arr = describe(x)
        dtype_code(arr.dtype)
        if self.rank != root and arr.readonly:
            raise ValueError("x: the array is read-only, but broadcast writes into it")
        finalize = None
        buf = arr
        if not arr.contiguous:
            # Broadcast into a contiguous copy, then write it back into x (on the
            # caller's stream, for a CUDA array).
            kind, target = array_for(arr, "x")
            buf = describe(kind.contiguous(target))

            def finalize() -> None:
                if self.rank != root:
                    kind.assign(target, buf.obj)

        return self._submit(
            _Collective.BROADCAST, buf, buf, _core.Op.SUM, root, x, (x,), async_op, finalize
        )

    def _root(self, root: Any) -> int:
        if not isinstance(root, (int, np.integer)) or not 0 <= int(root) < self.world_size:
            raise ValueError(f"root must be a rank in [0, {self.world_size}), got {root!r}")
        return int(root)

    def reduce(
        self,
        x: Any,
        op: Union[str, ReduceOp] = "sum",
        root: int = 0,
        *,
        out: Any = None,
        async_op: bool = False,
    ) -> Any:
        """Reduces x over all ranks into root: returns the result there (a new array, or
        ``out``; ``out=x`` reduces in place), None on the other ranks, whose arrays are
        left as they were.

        A ring reduce-scatter, then each rank's block to root: root receives (N-1)/N of
        x, half what all_reduce moves.
        """
        root = self._root(root)
        src = self._input(x)
        opc = _op_code(op, src.dtype)
        if self.rank == root:
            result, dst = self._output(out, src, src.shape)
            if src.ptr != dst.ptr and _overlap(src, dst):
                raise ValueError("out overlaps x without being x; pass out=x, or separate arrays")
        else:
            result, dst = None, _NOTHING
        return self._submit(_Collective.REDUCE, src, dst, opc, root, result, (x, out), async_op)

    def gather(self, x: Any, root: int = 0, *, out: Any = None, async_op: bool = False) -> Any:
        """Every rank's x on root, as an array of shape ``(world_size, *x.shape)`` (new,
        or ``out``); None on the other ranks."""
        root = self._root(root)
        src = self._input(x)
        if self.rank == root:
            result, dst = self._output(out, src, (self.world_size,) + src.shape)
        else:
            result, dst = None, _NOTHING
        return self._submit(
            _Collective.GATHER, src, dst, _core.Op.SUM, root, result, (x, out), async_op
        )

    def scatter(
        self, x: Any = None, root: int = 0, *, out: Any = None, async_op: bool = False
    ) -> Any:
        """Block r of root's x (shape ``(world_size, *block)``) to rank r: returns this
        rank's block (new, or ``out``). Ranks other than root pass ``out`` (which says
        the block's shape and dtype) and no x."""
        root = self._root(root)
        if self.rank == root:
            src = self._input(x)
            if len(src.shape) == 0 or src.shape[0] != self.world_size:
                raise ValueError(
                    f"x: scatter's input on root has shape (world_size, ...) = "
                    f"({self.world_size}, ...), got {src.shape}"
                )
            result, dst = self._output(out, src, src.shape[1:])
        else:
            if out is None:
                raise ValueError(
                    f"scatter: rank {self.rank} is not root ({root}): pass out=, an array of "
                    "the block's shape and dtype, to receive into"
                )
            dst = describe(out, "out")
            dtype_code(dst.dtype, "out")
            result, dst = self._output(out, dst, dst.shape)
            src = dataclasses.replace(
                _NOTHING, dtype=dst.dtype, itemsize=dst.itemsize, device=dst.device,
                stream=dst.stream,
            )  # fmt: skip
        return self._submit(
            _Collective.SCATTER, src, dst, _core.Op.SUM, root, result, (x, out), async_op,
            count=dst.size,
        )  # fmt: skip

    def all_to_all(
        self,
        x: Any,
        *,
        out: Any = None,
        send_counts: Optional[List[int]] = None,
        recv_counts: Optional[List[int]] = None,
        async_op: bool = False,
    ) -> Any:
        """Block r of x to rank r; returns the blocks received, in rank order.

        Without counts x's first dimension is cut into world_size equal blocks and the
        result has x's shape. With ``send_counts``/``recv_counts`` (rows of the first
        dimension for each rank, as torch's all_to_all_single splits), blocks may differ:
        the result has ``sum(recv_counts)`` rows. Every pair of ranks checks that the
        block one sends is the size the other expects (MismatchError otherwise).
        """
        src = self._input(x)
        n = self.world_size
        if len(src.shape) == 0:
            raise ValueError("x: all_to_all needs at least one dimension")
        row = int(np.prod(src.shape[1:], dtype=np.int64))
        if send_counts is None and recv_counts is None:
            if src.shape[0] % n:
                raise ValueError(
                    f"x: first dimension {src.shape[0]} does not split into {n} equal blocks; "
                    "pass send_counts and recv_counts"
                )
            result, dst = self._output(out, src, src.shape)
            return self._submit(
                _Collective.ALL_TO_ALL, src, dst, _core.Op.SUM, 0, result, (x, out), async_op,
                count=src.shape[0] // n * row,
            )  # fmt: skip
        sends = _counts(send_counts, n, "send_counts")
        recvs = _counts(recv_counts, n, "recv_counts")
        if sum(sends) != src.shape[0]:
            raise ValueError(f"send_counts add up to {sum(sends)} rows, but x has {src.shape[0]}")
        result, dst = self._output(out, src, (sum(recvs),) + tuple(src.shape[1:]))
        blocks = [
            [c * row for c in sends],
            [o * row for o in _offsets(sends)],
            [c * row for c in recvs],
            [o * row for o in _offsets(recvs)],
        ]
        return self._submit(
            _Collective.ALL_TO_ALL, src, dst, _core.Op.SUM, 0, result, (x, out), async_op,
            count=0, blocks=blocks,
        )  # fmt: skip

    # -- point-to-point -----------------------------------------------------
    def _peer(self, peer: Any, what: str, allow_any: bool = False) -> int:
        if peer is None and allow_any:
            return -1
        if (
            not isinstance(peer, (int, np.integer))
            or not 0 <= int(peer) < self.world_size
            or int(peer) == self.rank
        ):
            raise ValueError(
                f"{what} must be another rank in [0, {self.world_size}) than this one "
                f"({self.rank}), got {peer!r}"
            )
        return int(peer)

    def send(self, x: Any, dst: int, *, tag: int = 0, async_op: bool = False) -> Any:
        """Sends x to rank dst, to be taken by its ``recv`` with the same tag.

        Point-to-point messages travel on links of their own, in no order with the
        collectives; between two ranks, messages with one tag arrive in the order they
        were sent. Blocking: returns once x has left (it may not have arrived yet).
        """
        dst = self._peer(dst, "dst")
        buf = self._host_input(x, "x")
        handle = self._core.send(buf.ptr, buf.nbytes, dst, int(tag))
        return self._p2p(handle, None, (x, buf.obj), async_op)

    def recv(
        self, out: Any, src: Optional[int] = None, *, tag: int = 0, async_op: bool = False
    ) -> Any:
        """Receives into ``out`` the next message with ``tag`` from rank src (None: from
        any rank), which must be ``out``'s size. Returns the sender's rank."""
        src = self._peer(src, "src", allow_any=True)
        buf = describe(out, "out")
        dtype_code(buf.dtype, "out")
        if buf.host is None:
            raise ValueError("out: recv takes host memory (copy CUDA arrays to the host)")
        if buf.readonly or not buf.contiguous:
            raise ValueError("out: recv needs a writable, C-contiguous array")
        handle = self._core.recv(buf.ptr, buf.nbytes, src, int(tag))
        return self._p2p(handle, _Deferred(lambda: int(handle.source)), (out,), async_op)

    def _host_input(self, x: Any, what: str) -> Buffer:
        buf = self._input(x, what)
        if buf.host is None:
            raise ValueError(f"{what}: send takes host memory (copy CUDA arrays to the host)")
        return buf

    def _p2p(self, handle: Any, result: Any, keep: tuple, async_op: bool) -> Any:
        self._inflight = [(h, k) for h, k in self._inflight if not h.done()]
        self._inflight.append((handle, keep))
        work = Work(self, handle, result, keep)
        return work if async_op else work.wait()

    def all_gather_object(self, obj: Any) -> list:
        """Every rank's ``obj`` (anything picklable), as a list in rank order."""
        return _composite.all_gather_object(self, obj)

    def broadcast_object(self, obj: Any, root: int = 0) -> Any:
        """``root``'s ``obj`` (anything picklable), returned on every rank."""
        return _composite.broadcast_object(self, obj, root)

    def barrier(self) -> None:
        """Returns once every rank has called barrier()."""
        self._submit(_Collective.BARRIER, _NOTHING, _NOTHING, _core.Op.SUM, 0, None, (), False)

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
