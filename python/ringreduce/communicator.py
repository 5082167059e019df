"""The Python face of the engine: Communicator, Work and ReduceOp.

Every collective is written once: its arrays, wherever they live (host memory or a
GPU), become `Buffer` descriptors (`_buffers.describe`), results are allocated like
the input by the input's `ArrayKind`, and the call goes to the engine as pointers.
"""

from __future__ import annotations

import functools
import threading
import time
from typing import Any, Callable, List, Optional, Tuple, Union

import numpy as np

from . import _composite, _core
from ._arrays import array_for, kind_of
from ._buffers import Buffer, describe, dtype_code
from ._env import engine_options
from ._issuer import _Issuer
from ._ops import ReduceOp, _op_code
from ._rooted import _NOTHING, RootedAndPointToPoint, _Deferred, _overlap
from .errors import ConcurrentUseError, MismatchError, RingReduceError, TimeoutError

__all__ = ["ReduceOp", "Communicator", "Work", "chunk_bounds", "build_info"]

_Collective = _core.Collective


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
                try:
                    finished = self._handle.wait(max(left, 0.0))
                except MismatchError as exc:
                    explained = self._comm._issuer.explain(exc)
                    if explained is None:
                        raise
                    raise explained from exc
                except KeyboardInterrupt:
                    # Ctrl-C: the collective is abandoned where it runs, on the worker,
                    # which tells the peers (PeerError naming this rank there).
                    self._comm._core.interrupt()
                    raise
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


class Communicator(RootedAndPointToPoint):
    """A group of ranks that run collectives together. Create with ``ringreduce.init()``.

    Threads: ranks pair collectives in the order each rank issues them, so a
    communicator's collectives must be issued by one thread at a time, in the same order
    on every rank (several threads may take turns, as long as the order is the same
    everywhere). A collective that enters while another thread's collective on the same
    communicator is being issued (a blocking call: until it returns; ``async_op=True``:
    until it is queued) raises `ConcurrentUseError` naming both threads, and so does the
    other thread's call once it is done: its call may have paired with the wrong
    thread's call on another rank. From then on every collective on that communicator
    raises it, rather than risk reducing another thread's data. Threads that take
    turns in a different order on two ranks are caught as well: each call's header
    carries a tag of the issuing thread's name (the number in Python's default names,
    "Thread-7 (work)", left out), so threads that take turns must have the same names
    on every rank. ``Work.wait()``,
    point-to-point ``send``/``recv`` (matched by source and tag) and ``close()`` may be
    called from any thread. To run collectives from several threads at once, give each
    thread its own communicator. (The torch.distributed backend queues its threads'
    calls instead, as torch's contract leaves their order to the program.)
    """

    def __init__(self, core: Any, *, queue_threads: bool = False):
        """``core``: the engine's communicator. ``queue_threads``: a collective from a
        second thread waits for the first one's instead of raising ConcurrentUseError."""
        self._core = core
        self._issuer = _Issuer(core, queue_threads)
        # Arrays of async calls whose Work the caller may have dropped: the
        # engine still writes into them, so they must stay alive until done.
        self._inflight: List[Tuple[Any, tuple]] = []
        self._inflight_lock = threading.Lock()  # point-to-point calls come from any thread

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

    def _apart(self, src: Buffer, dst: Buffer, in_place_at: Optional[int] = None) -> Buffer:
        """src, or a copy of it where it shares memory with dst: the engine reads src
        while it writes dst, so a shared byte could be overwritten before it is sent.
        ``in_place_at``: the address in dst where the collective takes src as it is (its
        in-place form, as MPI_IN_PLACE)."""
        if src.ptr == in_place_at or not _overlap(src, dst):
            return src
        kind, arr = array_for(src, "x")
        return describe(kind.copy(arr), "x")

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
            self._issue(
                kind, self._core.run,
                kind, send.ptr, recv.ptr, count, code, op, root, send.device, send.stream, **extra,
            )  # fmt: skip
            if finalize is not None:
                finalize()
            return result
        keep = keep + (send.obj, recv.obj)
        handle = self._issue(
            kind, self._queue, keep,
            kind, send.ptr, recv.ptr, count, code, op, root, send.device, send.stream, **extra,
        )  # fmt: skip
        return Work(self, handle, result, keep, finalize)

    def _queue(self, keep: tuple, *args: Any, **kwargs: Any) -> Any:
        """Queues a collective, keeping its arrays alive until it is done (even if the
        caller never sees its Work: _issue may raise once it is queued)."""
        handle = self._core.submit(*args, **kwargs)
        self._keep_alive(handle, keep)
        return handle

    def _keep_alive(self, handle: Any, keep: tuple) -> None:
        with self._inflight_lock:
            self._inflight = [(h, k) for h, k in self._inflight if not h.done()]
            self._inflight.append((handle, keep))

    def _issue(self, kind: Any, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """call(*args, **kwargs): the one way collectives reach the engine, as one thread
        at a time (see the class's note on threads)."""
        issuer = self._issuer
        issuer.enter(kind)
        try:
            result = call(*args, **kwargs)
        except MismatchError as exc:
            explained = issuer.explain(exc)
            if explained is None:
                raise
            raise explained from exc
        finally:
            issuer.leave()
        if issuer.conflict is not None:  # another thread came in meanwhile
            raise ConcurrentUseError(issuer.message())
        return result

    # -- collectives ------------------------------------------------------
    def all_reduce(
        self, x: Any, op: Union[str, ReduceOp] = "sum", *, out: Any = None, async_op: bool = False
    ) -> Any:
        """Reduces x over all ranks; every rank gets the result (new array, or ``out``).

        ``out=x`` reduces in place. Non-contiguous x is copied first; ``out`` must be
        C-contiguous and writable, and in the same memory (host or GPU) as x.
        """
        if not async_op and type(x) is np.ndarray and (out is None or type(out) is np.ndarray):
            # The common case, checked and run in C++; None when it needs this path.
            result = self._issue(_Collective.ALL_REDUCE, self._core.all_reduce_numpy, x, out, op)
            if result is not None:
                return result
        src = self._input(x)
        opc = _op_code(op, src.dtype)
        result, dst = self._output(out, src, src.shape)
        if src.ptr != dst.ptr and _overlap(src, dst):
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
        # In place: out is this rank's block of x.
        src = self._apart(src, dst, in_place_at=dst.ptr - start * src.itemsize)
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
        # In place: x is this rank's row of out.
        src = self._apart(src, dst, in_place_at=dst.ptr + self.rank * src.nbytes)
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

    def _p2p(self, handle: Any, result: Any, keep: tuple, async_op: bool) -> Any:
        self._keep_alive(handle, keep)
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

    def abort(self) -> None:
        """Stops this rank's work now, from any thread, without waiting for anything.

        Queued collectives fail at once and the running one within milliseconds
        (``RingReduceError`` "... was aborted"), point-to-point operations likewise; the
        links are torn down, so the peers raise ``PeerError`` naming this rank rather than
        wait for their timeout. The process is never killed. Afterwards every call is
        refused, and ``close()`` still releases everything. Idempotent. This is what a
        fault-tolerance layer (torchft) calls to cancel work a dead peer will never join.
        """
        self._core.abort()

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"<ringreduce.Communicator rank={self.rank} world_size={self.world_size} "
            f"transport={self.transport!r}>"
        )


# -- refused calls --------------------------------------------------------------
# A collective that this rank refuses (bad arguments: ValueError/TypeError before it
# reaches the engine) leaves the other ranks inside it. The engine records why, so that
# their errors name this rank and its reason instead of only "rank 1 closed its
# connection" or a mismatch with its next call.
#
# The errors a collective documents (RingReduceError, and ValueError/TypeError for bad
# arguments) reach the caller without the frames of the layers they came through here:
# the call in the user's program, then one frame of ours, then the message. What caused
# them stays attached (``__cause__``). Any other exception is a fault of ours and keeps
# every frame.


def _counting_issues(issue: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(issue)
    def counted(self: Communicator, *args: Any, **kwargs: Any) -> Any:
        result = issue(self, *args, **kwargs)
        self._issued_here += 1
        return result

    return counted


def _announcing_refusal(method: Callable[..., Any]) -> Callable[..., Any]:
    name = method.__name__

    @functools.wraps(method)
    def checked(self: Communicator, *args: Any, **kwargs: Any) -> Any:
        before = self._issued_here
        try:
            return method(self, *args, **kwargs)
        except (ValueError, TypeError) as exc:
            if self._issued_here == before and self.world_size > 1:
                try:
                    self._core.note_refused_call(name, f"{type(exc).__name__}: {exc}")
                except Exception:  # noqa: BLE001 - the caller's error matters more
                    pass
            # The same error, its __cause__ and __context__ as they were (see above).
            raise exc.with_traceback(None)  # noqa: B904
        except RingReduceError as exc:
            raise exc.with_traceback(None)  # noqa: B904

    return checked


Communicator._issued_here = 0
Communicator._issue = _counting_issues(Communicator._issue)  # type: ignore[method-assign]
for _method in (
    "all_reduce",
    "reduce_scatter",
    "all_gather",
    "broadcast",
    "barrier",
    "reduce",
    "gather",
    "scatter",
    "all_to_all",
):
    setattr(Communicator, _method, _announcing_refusal(getattr(Communicator, _method)))
del _method
