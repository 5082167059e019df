"""The Python face of the engine: Communicator.

Every collective is written once: its arguments are shaped into one `Call` (`shaping`:
buffers described, results allocated like the input), which goes to the engine as
pointers through `_issue`, the one way in, as one thread at a time (`issuer`).
"""

from __future__ import annotations

import threading
from typing import Any, Callable, FrozenSet, List, Optional, Sequence, Tuple, Union

import numpy as np

from .. import _core
from .._arrays.buffer import dtype_code
from .._env import engine_options
from ..errors import ConcurrentUseError, MismatchError, RingReduceError
from .compressed import route as compressed
from .compressed.lane import Lane
from .core import composite, p2p, shaping, windows
from .core.issuer import Issuer
from .core.ops import ReduceOp
from .core.refusal import collective
from .core.shaping import Call
from .core.work import Work
from .membership.agreement import Membership
from .membership.resilience import Resilience

__all__ = ["Communicator", "build_info"]

_Collective = _core.Collective


def build_info() -> dict:
    """What this build contains: version, mpi, cuda, transports, cpu_kernels, codec_kernels."""
    return dict(_core.build_info())


class Communicator:
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

    _issued_here = 0  # calls handed to the engine (see refusal.collective)

    def __init__(
        self, core: Any, *, queue_threads: bool = False, membership: Optional[Membership] = None
    ):
        """``core``: the engine's communicator. ``queue_threads``: a collective from a
        second thread waits for the first one's instead of raising ConcurrentUseError.
        ``membership``: its standby stores, for agree and shrink (`membership`)."""
        self._core = core
        self._issuer = Issuer(core, queue_threads)
        # Compressed calls with async_op=True run there, in issue order (lane.py).
        self._lane = Lane(self._issuer.gate)
        # Who is in it: agree, shrink, grow (membership/resilience.py).
        self._resilience = Resilience(core, membership, self._lane.drain)
        self._fast_all_reduce = self._issuer.gate.all_reduce
        if type(self).all_reduce is Communicator.all_reduce:
            # comm.all_reduce without a Python frame in the common case: a builtin that
            # hands every other call to the method below (fast_path.cc).
            self.all_reduce = _core.bind_all_reduce(
                self, self._issuer.gate, Communicator.all_reduce, Communicator._declined
            )
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
        from . import mpi

        if not timeout or timeout <= 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        if transport not in ("mpi", "tcp", "shm", "auto"):
            raise ValueError(f"transport must be 'mpi', 'tcp', 'shm' or 'auto', got {transport!r}")
        options = engine_options(transport, timeout)
        if transport in ("mpi", "auto"):
            comm = cls(mpi.create_from_mpi4py(mpi4py_comm, options))
            mpi.track(comm)
            return comm
        return cls(mpi.create_tcp(mpi4py_comm, options))

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
        """Counters: bytes_sent, bytes_received (payload, and call headers where they are
        messages: not over shared memory), ops (collectives done), small_message_ops
        (all_reduce calls that took the small-message path); with compression, per
        codec: wire_bytes, codec_seconds, compression_error."""
        counters = dict(self._core.stats())
        counters.update(compressed.stats(self))
        return counters

    # -- the way in ----------------------------------------------------------
    def _issue(self, kind: Any, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """call(*args, **kwargs): the one way collectives reach the engine, as one thread
        at a time (see the class's note on threads)."""
        lane = self._lane
        if lane.busy and not lane.here():
            lane.drain()  # compressed calls issued before this one go first (lane.py)
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
        if not lane.here():  # the lane's calls are not the caller's (refusal.collective)
            self._issued_here += 1
        if issuer.conflict is not None:  # another thread came in meanwhile
            raise ConcurrentUseError(issuer.message())
        return result

    def _run(self, c: Call, async_op: bool) -> Any:
        """Runs a shaped call: here and now, or queued (``async_op``) as a Work."""
        code = dtype_code(c.send.dtype)
        count = c.send.size if c.count is None else c.count
        extra: dict = {} if c.blocks is None else {"blocks": c.blocks}
        if c.compression is not None:
            extra["compression"] = c.compression
        args = (c.kind, c.send.ptr, c.recv.ptr, count, code, c.op, c.root, c.send.device)
        if not async_op and self._lane.here():
            # The lane's calls go through the engine's worker, whose waits are polite:
            # a wait spinning here would take the core of the computation they overlap.
            return self._run(c, True).wait()
        if not async_op:
            # On this thread when nothing is queued: no hand-off to the worker.
            self._issue(c.kind, self._core.run, *args, c.send.stream, **extra)
            if c.finalize is not None:
                c.finalize()
            return c.result
        keep = c.keep + (c.send.obj, c.recv.obj)
        handle = self._issue(c.kind, self._queue, keep, *args, c.send.stream, **extra)
        return Work(self, handle, c.result, keep, c.finalize)

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

    # -- collectives ------------------------------------------------------
    def all_reduce(
        self,
        x: Any,
        op: Union[str, ReduceOp] = "sum",
        *,
        out: Any = None,
        async_op: bool = False,
        compression: Optional[str] = None,
        error_feedback: Any = None,
    ) -> Any:
        """Reduces x over all ranks; every rank gets the result (new array, or ``out``).

        ``out=x`` reduces in place. Non-contiguous x is copied first; ``out`` must be
        C-contiguous and writable, and in the same memory (host or GPU) as x.
        ``compression`` ("bf16", "fp16", "int8", "int4", "auto") sends fewer bytes and
        sums in float32; ``error_feedback`` (an `ErrorFeedback`) carries what the codec
        dropped into the next call (docs/compression.md).
        """
        how = compressed.route(self, x, op, compression, error_feedback, async_op)
        if how == "fast":
            # The common case (host numpy arrays, blocking) is checked and run in C++,
            # through the same thread gate; None when the call needs the general path,
            # and then nothing was issued. ("auto" calls kept exact come here too: the
            # general path's checks and shaping cost 10-60 us.) The builtin that is
            # comm.all_reduce tried it already for the calls it takes (_declined).
            try:
                result = self._fast_all_reduce(x, out, op)
            except RingReduceError as exc:
                raise self._fast_failed(exc).with_traceback(None)  # noqa: B904
            if result is not None:
                return result
        try:
            return self._all_reduce(
                x,
                op,
                out=out,
                async_op=async_op,
                compression=compression,
                error_feedback=error_feedback,
                compressed_path=how == "compressed",
            )
        except (ValueError, TypeError, RingReduceError) as exc:
            # One frame of ours in the traceback, as every collective shows (refusal.py).
            raise exc.with_traceback(None)  # noqa: B904

    def _declined(self, x: Any, op: Any, out: Any) -> Any:
        """A blocking exact all_reduce the fast path declined (comm.all_reduce, the
        builtin, tried it): the general exact path, with no second try."""
        try:
            return self._all_reduce(
                x,
                op,
                out=out,
                async_op=False,
                compression=None,
                error_feedback=None,
                compressed_path=False,
            )
        except (ValueError, TypeError, RingReduceError) as exc:
            raise exc.with_traceback(None)  # noqa: B904

    def _fast_failed(self, exc: RingReduceError) -> RingReduceError:
        """The error to raise when the engine failed a fast-path call: as the general
        path raises it (threads named by the issuer, a revoked communicator's PeerError)."""
        explained = self._issuer.explain(exc)
        if explained is not None:
            explained.__cause__ = exc
            exc = explained
        return self._revoke(exc)

    @collective
    def _all_reduce(
        self,
        x: Any,
        op: Union[str, ReduceOp],
        *,
        out: Any,
        async_op: bool,
        compression: Optional[str],
        error_feedback: Any,
        compressed_path: bool,
    ) -> Any:
        """all_reduce's general path: any array, async, compressed (as `route` said)."""
        if compressed_path:
            return compressed.all_reduce(
                self,
                x,
                op,
                out=out,
                async_op=async_op,
                compression=compression,
                error_feedback=error_feedback,
            )
        return self._run(shaping.all_reduce(x, op, out), async_op)

    @collective
    def reduce_scatter(
        self,
        x: Any,
        op: Union[str, ReduceOp] = "sum",
        *,
        out: Any = None,
        async_op: bool = False,
        compression: Optional[str] = None,
        error_feedback: Any = None,
    ) -> Any:
        """Reduces x over all ranks; returns this rank's block of the flattened result.

        The block is ``chunk_bounds(x.size, world_size, rank)``; the result is 1-D.
        ``compression`` and ``error_feedback`` as in `all_reduce`.
        """
        if compressed.route(self, x, op, compression, error_feedback, async_op) == "compressed":
            return compressed.reduce_scatter(
                self,
                x,
                op,
                out=out,
                async_op=async_op,
                compression=compression,
                error_feedback=error_feedback,
            )
        return self._run(shaping.reduce_scatter(self.rank, self.world_size, x, op, out), async_op)

    @collective
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
            return composite.all_gather_uneven(self, x)
        return self._run(shaping.all_gather(self.rank, self.world_size, x, out), async_op)

    @collective
    def broadcast(self, x: Any, root: int = 0, *, async_op: bool = False) -> Any:
        """Fills x in place, on every rank, with root's x. Returns x."""
        return self._run(shaping.broadcast(self.rank, self.world_size, x, root), async_op)

    @collective
    def barrier(self) -> None:
        """Returns once every rank has called barrier()."""
        self._run(shaping.barrier(), False)

    @collective
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
        return self._run(shaping.reduce(self.rank, self.world_size, x, op, root, out), async_op)

    @collective
    def gather(self, x: Any, root: int = 0, *, out: Any = None, async_op: bool = False) -> Any:
        """Every rank's x on root, as an array of shape ``(world_size, *x.shape)`` (new,
        or ``out``); None on the other ranks."""
        return self._run(shaping.gather(self.rank, self.world_size, x, root, out), async_op)

    @collective
    def scatter(
        self, x: Any = None, root: int = 0, *, out: Any = None, async_op: bool = False
    ) -> Any:
        """Block r of root's x (shape ``(world_size, *block)``) to rank r: returns this
        rank's block (new, or ``out``). Ranks other than root pass ``out`` (which says
        the block's shape and dtype) and no x."""
        return self._run(shaping.scatter(self.rank, self.world_size, x, root, out), async_op)

    @collective
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
        call = shaping.all_to_all(self.world_size, x, out, send_counts, recv_counts)
        return self._run(call, async_op)

    def share_state(self, state: Optional[dict] = None) -> dict:
        """Hands a state (a dict of name -> numpy array: parameters, optimizer state) to
        the ranks that lack it, typically newcomers after ``grow``: holders pass it,
        the others pass None; every rank returns the dict (holders their own arrays).
        Striped over the holders, in one collective (see `composite.share_state`)."""
        return composite.share_state(self, state)

    def all_gather_object(self, obj: Any) -> list:
        """Every rank's ``obj`` (anything picklable), as a list in rank order."""
        return composite.all_gather_object(self, obj)

    def broadcast_object(self, obj: Any, root: int = 0) -> Any:
        """``root``'s ``obj`` (anything picklable), returned on every rank."""
        return composite.broadcast_object(self, obj, root)

    # -- point-to-point -------------------------------------------------------
    def send(self, x: Any, dst: int, *, tag: int = 0, async_op: bool = False) -> Any:
        """Sends x to rank dst, to be taken by its ``recv`` with the same tag.

        Point-to-point messages travel on links of their own, in no order with the
        collectives; between two ranks, messages with one tag arrive in the order they
        were sent. Blocking: returns once x has left (it may not have arrived yet).
        """
        return p2p.send(self, x, dst, tag, async_op)

    def recv(
        self, out: Any, src: Optional[int] = None, *, tag: int = 0, async_op: bool = False
    ) -> Any:
        """Receives into ``out`` the next message with ``tag`` from rank src (None: from
        any rank), which must be ``out``'s size. Returns the sender's rank."""
        return p2p.recv(self, out, src, tag, async_op)

    # -- windows -------------------------------------------------------------
    @collective
    def empty(
        self, shape: Union[int, Sequence[int]], dtype: Any = np.float32, device: Any = None
    ) -> Any:
        """A numpy array, zeroed, in memory that every rank of this host maps.

        Collective: every rank calls it, in the same order as its other collectives;
        each may ask for its own shape. The k-th call makes window k everywhere.

        An ``all_reduce`` whose input and ``out=`` (or one array, in place) come from
        ``empty`` on every rank takes the window path: each rank reduces its chunk
        straight out of the other ranks' arrays and writes it into theirs
        (``stats()["all_reduce_algorithms"]["window"]`` counts these calls); calls of
        up to 4 KiB per rank take the direct path, faster there.
        Every rank must then pass such arrays or none: a rank that passes other
        memory gets MismatchError, naming the window path. ``torch.from_numpy`` gives
        a tensor over the same memory.

        Keep the array while any rank may still pass its window: a rank whose
        peer's window is gone here refuses the call with an error saying so.
        Where the ranks do not all share one host, or on one rank, this is a plain
        ``numpy.zeros``, and all_reduce takes its usual path.

        ``device="cuda"`` (or ``"cuda:N"``, or N): the window is memory of that GPU,
        which every rank of the host maps through CUDA IPC, returned as a
        ``DeviceWindowArray`` (``__cuda_array_interface__``: ``torch.as_tensor(a,
        device="cuda")`` or ``cupy.asarray(a)`` view it). An all_reduce on such arrays
        on every rank, at any size, reduces on the GPUs: each rank's kernels read its
        chunk of every rank's input where it is and write it into every rank's output,
        with no copy through host memory. Where some rank's GPU cannot map another's
        (different GPUs without peer access), every rank gets memory of its own
        (``.shared`` is False, ``.window.unshared_reason`` says why), whose all_reduce
        is staged through the host. Without a GPU, or in a ringreduce built without
        CUDA, every rank raises RingReduceError saying why.
        """
        return windows.empty(self, shape, dtype, device)

    # -- membership ----------------------------------------------------------
    @property
    def revoked(self) -> bool:
        """True once the communicator failed (a peer died, left or timed out, calls
        disagreed) or was aborted: every later collective raises PeerError; agree,
        shrink and close still work."""
        return self._resilience.revoked

    @property
    def failed_ranks(self) -> FrozenSet[int]:
        """The set of ranks known to be dead (the same on every survivor after ``agree``
        or ``shrink``)."""
        return self._resilience.failed_ranks

    def agree(self, flag: bool = True, timeout: Optional[float] = None) -> bool:
        """A fault-tolerant AND of ``flag`` over the live members; every survivor calls it
        and gets the same answer and the same ``failed_ranks``. Works on a revoked
        communicator; a rank counted dead (silent until ``timeout``, default the
        communicator's) gets PeerError. So does every member when they are not the
        majority of the live part (see ``shrink``)."""
        return self._resilience.agree(flag, timeout)

    def shrink(self, timeout: Optional[float] = None) -> Communicator:
        """A new communicator of the survivors (every survivor calls it): ranks renumbered
        in the old order, the same transport and token, meeting on the standby store of
        the lowest survivor, so it works when rank 0 is the one that died.

        Ranks counted dead without proof that their process is gone (their machine
        answered nothing, or they stayed silent) may be alive on the other side of a
        network partition: the survivors go on only when they outnumber those, or equal
        them and hold the lowest rank of all, and otherwise every one of them raises
        PeerError ("no majority"), so the two sides never both go on."""
        core, membership = self._resilience.shrink(timeout)
        return type(self)(core, membership=membership)

    def grow(self, world_size: int, timeout: Optional[float] = None) -> Communicator:
        """A new communicator of the members and ``world_size - self.world_size``
        newcomers, each of which calls ``ringreduce.join()`` (every member calls grow).
        Members keep their ranks; newcomers take the next ones. The newcomers find the
        job at its rendezvous address (MASTER_ADDR/MASTER_PORT), served by the lowest
        member while the grow lasts. This communicator stays usable, whatever happens."""
        core, membership = self._resilience.grow(world_size, timeout)
        return type(self)(core, membership=membership)

    @property
    def _membership(self) -> Optional[Membership]:
        """Its standby stores (None: made from another library's communicator)."""
        return self._resilience.membership

    def _live_membership(self, what: str) -> Membership:
        return self._resilience.live(what)

    def _revoke(self, exc: RingReduceError) -> RingReduceError:
        """The error to raise for a failed call (see `Resilience.revoke`)."""
        return self._resilience.revoke(exc)

    # -- lifetime ---------------------------------------------------------
    def close(self) -> None:
        """Finishes queued collectives, then closes every connection. Idempotent."""
        self._lane.drain()
        self._core.close()
        self._inflight.clear()
        compressed.release(self)

    def abort(self) -> None:
        """Stops this rank's work now, from any thread, without waiting for anything.

        Queued collectives fail at once and the running one within milliseconds
        (``RingReduceError`` "... was aborted"), point-to-point operations likewise; the
        peers are told (TCP ring links are parked for a ``shrink`` to take over, the
        others closed), so they raise ``PeerError`` naming this rank rather than wait for
        their timeout. The process is never killed. Afterwards every call is
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
