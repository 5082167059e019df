"""GradientBucketer: the buckets, the hand-over of gradients, the asynchronous
all-reduces and the wait (see the package's docstring for the whole picture)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from ..errors import MismatchError, PeerError
from .bucket import _Bucket
from .compress import CompressionState, compressed_buckets
from .memory import BucketMemory
from .plan import (
    MIB,
    ParamSpec,
    as_dtype,
    check_plan,
    describe_plan,
    is_floating,
    make_spec,
    plan_buckets,
)
from .recovery import keep_results, launch_fault_tolerant, replay
from .trace import Observability, Timeline
from .tree import TreeReduction

__all__ = ["GradientBucketer", "Handle"]

Handle = int
"""What `GradientBucketer.register` returns: the parameter's registration index."""


class GradientBucketer(CompressionState, Observability, TreeReduction):
    """Buckets gradients and all-reduces each bucket as soon as it is full.

    Args:
        comm: a ringreduce Communicator (anything with ``rank``, ``world_size``,
            ``all_reduce(x, out=, async_op=)`` and ``all_gather``).
        bucket_mb: cap of every bucket but the first, in MiB of wire bytes.
        first_bucket_mb: cap of the first bucket (the last layers' gradients), kept small
            so communication starts early in backward.
        average: divide by the world size, so the result is the mean over ranks, not the
            sum. The division happens while copying into the bucket (before the sum), as in
            PyTorch DDP, which keeps fp16/bf16 sums in range.
        comm_dtype: dtype of floating-point gradients on the wire (e.g. ``"bfloat16"`` or
            ``ml_dtypes.bfloat16``); results are cast back to each gradient's dtype.
            Default: each gradient's own dtype.
        max_trace_steps: how many recent steps `save_trace` keeps (the summary counts all).
        fault_tolerant: when a rank dies during a step's all-reduces, `wait` shrinks the
            communicator (``Communicator.shrink``), reduces the step's buckets again among
            the survivors, averaged over their number, and returns: the step finishes
            without the dead rank's micro-batch. Keeps a copy of each bucket's local
            contribution while it is reduced, and of its result until the next step ends
            (a survivor on which the death ended the step hands it to one on which it
            did not). The communicator in use is `comm`.
        on_membership_change: called with the new communicator after a shrink (to
            re-shard the data, say).
        compression: each bucket's all-reduce through a codec ("bf16", "fp16", "int8",
            "int4", "auto" or a Codec; docs/compression.md), float64 gradients in float32
            buckets. Blocking: a bucket is compressed when it is launched, in `ready`.
        error_feedback: with compression, keep what the codec drops, per parameter name,
            and add it to the next synchronised step (True, or an `ErrorFeedback` to keep
            it in). Saved by `state_dict`; read it through `error_feedback`.
        powersgd_rank: reduce buckets by rank-r PowerSGD instead (matrices low-rank,
            vectors exact, residuals and warm-start factors by name, in `state_dict`).
        windows: put the buckets in windows of the communicator (``comm.empty``: memory
            every rank of the host maps), so that each bucket's all-reduce reads the
            peers' buckets in place (one copy, where the ring copies every message into
            shared memory and out again). None (default): where every rank of the
            communicator shares this host (transport "shm") and the buckets are in host
            memory, without compression; True: always (the communicator gives plain
            memory where it cannot), GPU buckets included: device windows
            (``comm.empty(..., device=...)``, mapped by every rank of the host through
            CUDA IPC), whose all-reduce runs peer to peer on the GPUs; False: never. The
            buckets are allocated collectively, in plan order, when the plan is fixed,
            and again on the new communicator after a fault-tolerant shrink or `adopt`.

    The plan is fixed when registration completes, i.e. at the first `ready`, `wait` or
    `all_reduce_tree`: buckets follow registration order reversed (backward produces the
    last layer's gradients first), the first bucket holds at most ``first_bucket_mb``, the
    others at most ``bucket_mb``, and a parameter larger than its cap gets a bucket of its
    own. The plan is then compared across ranks (one small all-gather); if any rank
    registered different names, shapes, dtypes, order or settings, every rank raises
    `MismatchError` naming the first differing parameter and the ranks.

    Buckets launch in plan order on every rank: a bucket that fills before an earlier one
    is held back until the earlier one launches, because collectives on one communicator
    must be issued in the same order everywhere.

    Buckets live where the gradients do: in host memory for numpy arrays and CPU tensors,
    on the GPU for CUDA tensors and cupy arrays (reduced there by the device executor,
    with copies on the caller's current stream). The first gradient handed over decides;
    every later one must live in the same place.

    Not thread-safe: call it from one thread (PyTorch runs CPU backward hooks on the thread
    that called ``backward()``).
    """

    def __init__(
        self,
        comm: Any,
        bucket_mb: float = 25.0,
        first_bucket_mb: float = 1.0,
        average: bool = True,
        comm_dtype: Any = None,
        *,
        max_trace_steps: int = 1000,
        fault_tolerant: bool = False,
        on_membership_change: Callable[[Any], None] | None = None,
        compression: Any = None,
        error_feedback: Any = False,
        powersgd_rank: int | None = None,
        windows: bool | None = None,
    ) -> None:
        if windows not in (None, True, False):
            raise TypeError(f"windows must be None, True or False, got {windows!r}")
        if windows and (compression is not None or powersgd_rank is not None):
            raise ValueError(
                "windows=True: compressed buckets (compression=, powersgd_rank=) are not "
                "reduced by a plain all_reduce, so windows would not serve them"
            )
        if not bucket_mb > 0 or not first_bucket_mb > 0:
            raise ValueError(
                f"bucket sizes must be positive, got bucket_mb={bucket_mb}, "
                f"first_bucket_mb={first_bucket_mb}"
            )
        if max_trace_steps < 1:
            raise ValueError(f"max_trace_steps must be >= 1, got {max_trace_steps}")
        self._compress = compressed_buckets(
            comm, compression, error_feedback, powersgd_rank, average, fault_tolerant, comm_dtype
        )
        self._comm = comm
        self._windows = windows
        # Whether the buckets are in windows (decided when the plan is fixed), and what
        # the next _finalize must do on a communicator that changed since: "adopt" (check
        # the plan with every rank of it, then re-allocate), "shrink" (re-allocate).
        self._in_windows = False
        self._moved: str | None = None
        self._fault_tolerant = bool(fault_tolerant)
        self._on_membership_change = on_membership_change
        self._world_size = int(comm.world_size)
        self._rank = int(comm.rank)
        self._bucket_mb = float(bucket_mb)
        self._first_bucket_mb = float(first_bucket_mb)
        self._average = bool(average)
        self._comm_dtype = None if comm_dtype is None else as_dtype(comm_dtype)
        if self._comm_dtype is not None and not is_floating(self._comm_dtype):
            raise TypeError(f"comm_dtype must be a floating-point dtype, got {comm_dtype!r}")
        self._specs: list[ParamSpec] = []
        self._names: set[str] = set()
        self._buckets: list[_Bucket] | None = None
        # Where the buckets live, decided by the first gradient handed over (host memory
        # if wait() comes first), and the array work between gradients and buckets.
        self._memory = BucketMemory()
        # Where each parameter lives: (bucket index, offset in the bucket buffer).
        self._slots: list[tuple[int, int]] = []
        self._timeline = Timeline(self._rank, max_trace_steps)
        self._step = 0
        self._no_sync_depth = 0
        self._reset_step_state()

    # ----------------------------------------------------------------- registration

    def register(self, name: str, shape: Sequence[int], dtype: Any) -> Handle:
        """Declares a parameter whose gradient will be given to `ready`; returns its handle.

        Register in model order (first layer first). ``dtype`` is the gradient's dtype:
        a numpy dtype, a name such as ``"float32"`` or ``"bfloat16"``, or a torch dtype.
        Raises ValueError for a repeated name, RuntimeError once the plan is fixed.
        """
        if self._buckets is not None:
            raise RuntimeError(
                "register() after the bucket plan was fixed by the first "
                "ready(), wait() or all_reduce_tree()"
            )
        spec = make_spec(name, shape, dtype, self._names, floating_only=self._average)
        self._names.add(name)
        self._specs.append(spec)
        return len(self._specs) - 1

    @property
    def plan(self) -> list[list[str]]:
        """Parameter names per bucket, in launch order (computed from the registrations so
        far; fixed, and checked across ranks, at the first ready/wait)."""
        return [[self._specs[i].name for i in bucket] for bucket in self._plan_indices()]

    @property
    def world_size(self) -> int:
        """Number of ranks the gradients are reduced over."""
        return self._world_size

    @property
    def comm(self) -> Any:
        """The communicator in use (a shrunk one after a fault-tolerant step lost a rank)."""
        return self._comm

    def _wire_dtype(self, spec: ParamSpec) -> np.dtype:
        if self._comm_dtype is not None and is_floating(spec.dtype):
            return self._comm_dtype
        return spec.dtype if self._compress is None else self._compress.wire_dtype(spec.dtype)

    def _plan_indices(self) -> list[list[int]]:
        wire = [self._wire_dtype(s) for s in self._specs]
        sizes = [s.numel * w.itemsize for s, w in zip(self._specs, wire)]
        return plan_buckets(sizes, wire, self._first_bucket_mb * MIB, self._bucket_mb * MIB)

    def _use_windows(self) -> bool:
        """Whether the buckets go in windows of the communicator (see ``windows``)."""
        comm = self._comm
        if self._windows is False or not hasattr(comm, "empty"):
            if self._windows:
                raise TypeError(
                    f"windows=True: {type(comm).__name__} has no empty() to allocate windows"
                )
            return False
        if not self._memory.on_host:
            # Device windows when asked for. None leaves GPU buckets as device memory of
            # their own (the engine stages their all-reduce) until the device window
            # path has been measured against staging on GPUs.
            return bool(self._windows)
        if self._windows:
            return True
        # Windows are shared memory: every rank on this host, over shared memory.
        one_host = getattr(comm, "transport", None) == "shm"
        return self._compress is None and self._world_size > 1 and one_host

    def _check_plan(self) -> None:
        if self._world_size <= 1:
            return
        settings = {
            "bucket_mb": self._bucket_mb,
            "first_bucket_mb": self._first_bucket_mb,
            "average": self._average,
            "comm_dtype": None if self._comm_dtype is None else self._comm_dtype.name,
            "windows": self._in_windows,
        }
        if self._compress is not None:
            settings.update(self._compress.settings())
        check_plan(self._comm, describe_plan(self._specs, settings), MismatchError)

    def _allocate(self, elements: int, dtype: np.dtype) -> Any:
        window = self._comm.empty if self._in_windows else None
        return self._memory.bucket(elements, dtype, window)

    def adopt(self, comm: Any) -> None:
        """Goes on with ``comm``: the communicator after a ``grow`` (or a shrink made
        outside this bucketer), with the same parameters registered on every rank of it.
        Call it between steps, on every member; a newcomer makes its bucketer on ``comm``.
        At the next `ready` or `wait` (where a newcomer's bucketer fixes its plan) every
        rank checks the plan with the others, and buckets in windows are allocated again
        on ``comm``, collectively, with their contents."""
        if self._ready_count or self._no_sync_depth:
            raise RuntimeError("adopt() in the middle of a step: call wait() first")
        self._comm = comm
        self._world_size = int(comm.world_size)
        self._rank = int(comm.rank)
        for bucket in self._buckets or ():
            if bucket.divisor != 1:
                bucket.divisor = self._world_size
        if self._buckets is not None:
            self._moved = "adopt"

    def _rehome(self) -> None:
        """After the communicator changed: the plan checked on the new one ("adopt"), and
        buckets in windows allocated again there (collective), keeping their contents."""
        moved, self._moved = self._moved, None
        assert self._buckets is not None
        was = self._in_windows
        if moved == "adopt":
            self._in_windows = self._use_windows()
            self._check_plan()
        if not (was or self._in_windows):
            return
        for bucket in self._buckets:
            old = bucket.buffer
            bucket.buffer = self._allocate(bucket.elements, bucket.dtype)
            self._memory.restore(bucket.buffer, old)
        self._generation += 1

    _generation = 0

    def generation(self) -> int:
        """How many times the buckets were allocated again (after `adopt`, or a
        fault-tolerant shrink, with buckets in windows): views of them (`view`) taken at
        another generation are stale. A re-allocation still pending is done first (it is
        collective: call this where `ready` would do it, in the same order everywhere)."""
        if self._buckets is not None and self._moved is not None:
            self._rehome()
        return self._generation

    def _finalize(self, first: Any = None) -> list[_Bucket]:
        """Fixes the plan, allocates the bucket buffers where ``first`` (the first gradient
        handed over, as `_array` returned it) lives, and checks the plan across ranks."""
        if self._buckets is not None:
            if self._moved is not None:
                self._rehome()
            return self._buckets
        if not self._memory.placed:
            self._memory.place(np.zeros(0) if first is None else first)
        plan = self._plan_indices()
        self._in_windows = self._use_windows()
        self._check_plan()
        buckets: list[_Bucket] = []
        self._slots = [(0, 0)] * len(self._specs)
        for b, params in enumerate(plan):
            offsets = []
            total = 0
            for i in params:
                self._slots[i] = (b, total)
                offsets.append(total)
                total += self._specs[i].numel
            dtype = self._wire_dtype(self._specs[params[0]])
            # PowerSGD averages by itself: nothing divided before, nothing after.
            powersgd = self._compress is not None and self._compress.powersgd is not None
            average = self._world_size if self._average and not powersgd else 1
            buffer = self._allocate(total, dtype)
            buckets.append(_Bucket(b, params, offsets, buffer, average, total, dtype))
        self._buckets = buckets
        if self._compress is not None:
            self._compress.setup(buckets, self._specs)
        self._reset_step_state()
        return buckets

    # ----------------------------------------------------------------- one step

    def _reset_step_state(self) -> None:
        n = len(self._specs)
        # The array given to ready() for each parameter: wait() writes the result into it.
        self._given: list[Any] = [None] * n
        self._is_ready = [False] * n
        self._ready_count = 0
        # no_sync() accumulators, in each gradient's own dtype (never the wire dtype, so
        # bfloat16 on the wire does not round every micro-step).
        self._accum: list[Any] = [None] * n
        self._next_launch = 0
        self._next_done = 0
        for bucket in self._buckets or ():
            bucket.reset()

    def _view(self, index: int) -> Any:
        b, offset = self._slots[index]
        assert self._buckets is not None
        return self._memory.view(self._buckets[b].buffer, offset, self._specs[index].shape)

    def _check_handle(self, handle: Handle) -> int:
        if not isinstance(handle, (int, np.integer)) or not 0 <= handle < len(self._specs):
            raise ValueError(
                f"unknown handle {handle!r}: register() returns handles 0..{len(self._specs) - 1}"
            )
        return int(handle)

    def ready(self, handle: Handle, grad: Any, *, write_back: bool = True) -> None:
        """Hands over one parameter's gradient for this step.

        ``grad`` is an array of the registered shape and dtype (numpy, torch CPU or CUDA,
        cupy, DLPack, buffer protocol). It is copied into its bucket, and when that bucket
        is complete and every earlier bucket has launched, its all-reduce is launched
        asynchronously. With ``write_back`` (default), `wait` writes the reduced gradient
        back into ``grad``, which must then be writable; without, the result is only in
        `view` (handle).

        Inside `no_sync` the gradient is only added to a local accumulator. Calling it
        twice for one parameter in a synchronised step raises ValueError.
        """
        index = self._check_handle(handle)
        arr = self._memory.gradient(self._specs[index], grad, writable=write_back)
        buckets = self._finalize(arr)
        if self._no_sync_depth:
            self._accum[index] = self._memory.accumulate(self._accum[index], arr)
            self._given[index] = arr if write_back else None
            return
        self._check_once(index)
        source = arr
        if self._accum[index] is not None:
            source = self._memory.accumulate(self._accum[index], arr)
            self._accum[index] = None
        bucket = buckets[self._slots[index][0]]
        self._memory.fill(self._view(index), source, bucket.divisor)
        self._given[index] = arr if write_back else None
        self._mark_ready(index, bucket, buckets)

    def view(self, handle: Handle) -> Any:
        """The parameter's place in its bucket, shaped like the parameter: after `wait`, it
        holds the reduced gradient. A gradient accumulated there directly (a framework's
        ``.grad`` made a view of it) is handed over with `ready_in_bucket`, with no copy.
        Fixes the plan; the buckets live where the first gradient handed over did (host
        memory if none was yet)."""
        index = self._check_handle(handle)
        self._finalize()
        return self._view(index)

    def ready_in_bucket(self, handle: Handle) -> None:
        """Like `ready`, for a gradient that is already in `view` (handle): nothing is
        copied in or written back. Inside `no_sync` it does nothing, since the gradient
        keeps accumulating where it is."""
        index = self._check_handle(handle)
        buckets = self._finalize()
        if self._no_sync_depth:
            return
        self._check_once(index)
        if self._accum[index] is not None:
            self._memory.accumulate(self._view(index), self._accum[index])
            self._accum[index] = None
        bucket = buckets[self._slots[index][0]]
        if bucket.divisor != 1:
            view = self._view(index)
            self._memory.fill(view, view, bucket.divisor)
        self._given[index] = None
        self._mark_ready(index, bucket, buckets)

    def _check_once(self, index: int) -> None:
        if self._is_ready[index]:
            raise ValueError(
                f"ready() called twice for parameter {self._specs[index].name!r} "
                f"in one step (wait() ends a step); a parameter used twice in "
                f"forward must be handed over once, after its gradient is "
                f"complete"
            )

    def _mark_ready(self, index: int, bucket: _Bucket, buckets: list[_Bucket]) -> None:
        self._is_ready[index] = True
        self._ready_count += 1
        now = time.perf_counter()
        if bucket.first_ready is None:
            bucket.first_ready = now
        bucket.last_ready = now
        bucket.pending -= 1
        if bucket.pending == 0:
            self._launch_ready_buckets(buckets)
        self._poll(buckets)

    def _launch(self, bucket: _Bucket) -> None:
        bucket.launch = time.perf_counter()
        if self._fault_tolerant:
            launch_fault_tolerant(self, bucket)
        else:
            bucket.work = self._issue(bucket)

    def _issue(self, bucket: _Bucket) -> Any:
        """Starts the bucket's reduction over the communicator in use; its Work."""
        if self._compress is not None:
            views = [self._view(i) for i in bucket.params]
            return self._compress.issue(self._comm, bucket, views)
        return self._comm.all_reduce(bucket.buffer, op=bucket.op, out=bucket.buffer, async_op=True)

    def _launch_ready_buckets(self, buckets: list[_Bucket]) -> None:
        # Strictly in plan order, so that every rank issues the same sequence of
        # collectives whatever order its gradients arrive in.
        while self._next_launch < len(buckets) and buckets[self._next_launch].pending == 0:
            self._launch(buckets[self._next_launch])
            self._next_launch += 1

    def _poll(self, buckets: list[_Bucket]) -> None:
        # Collectives complete in issue order, so only the oldest in-flight one is asked.
        while self._next_done < self._next_launch:
            bucket = buckets[self._next_done]
            if not bucket.work.done():
                break
            bucket.done = time.perf_counter()
            self._next_done += 1

    def wait(self) -> None:
        """Ends the step: reduces every bucket and writes the results back.

        Buckets not launched yet are launched now; parameters not handed to `ready` this
        step (unused parameters) contribute zeros, or what `no_sync` accumulated for them.
        Then every array given to `ready` since the last `wait` (the latest one, for a
        parameter handed over several times under `no_sync`) holds the reduced gradient,
        bitwise identical on every rank. Inside `no_sync` this does nothing.

        Each bucket is written back as soon as it is done. When a collective fails (and
        the bucketer is not ``fault_tolerant``), the buckets done before it therefore hold
        reduced gradients and the others do not: redo such a step from new gradients.
        """
        if self._no_sync_depth:
            return
        buckets = self._finalize()
        start = time.perf_counter()
        try:
            for bucket in buckets[self._next_launch :]:
                for index in bucket.params:
                    if not self._is_ready[index]:
                        self._memory.fill(self._view(index), self._accum[index], bucket.divisor)
                bucket.pending = 0
            self._launch_ready_buckets(buckets)
            self._poll(buckets)
            written, copying = 0, 0.0  # buckets written back, and the seconds it took
            try:
                # Every bucket, the polled ones too: a failed Work is done, and only its
                # wait() raises. Each bucket is written back as soon as it is done, while
                # later ones are still reduced, as DDP's reducer does.
                for bucket in buckets:
                    bucket.work.wait()
                    bucket.done = bucket.done or time.perf_counter()
                    self._poll(buckets)  # later buckets' ends, before this copy delays them
                    copying += self._write_back(bucket)
                    written += 1
            except PeerError:
                if not self._fault_tolerant:
                    raise
                replay(self, buckets)  # every bucket again: write every one back
                written, copying = 0, 0.0
            self._next_done = len(buckets)
            for bucket in buckets[written:]:
                copying += self._write_back(bucket)
            if self._fault_tolerant:
                keep_results(self, buckets)
            # The copies are write-back time, not communication exposed in wait().
            end = time.perf_counter()
            self._timeline.record_buckets(self._step, buckets, start, end - copying, end)
            self._step += 1
        finally:
            # After a failed collective the step cannot be resumed; start clean so the
            # caller sees the error, not a confusing state on the next call.
            self._reset_step_state()

    def _write_back(self, bucket: _Bucket) -> float:
        """The reduced gradients of ``bucket`` into the arrays `ready` was given; returns
        the seconds it took."""
        t0 = time.perf_counter()
        for index in bucket.params:
            arr = self._given[index]
            if arr is not None:
                self._memory.write_back(arr, self._view(index))
        return time.perf_counter() - t0

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Gradient accumulation: inside, `ready` only adds gradients to local accumulators
        and nothing is communicated; `wait` does nothing.

        The next synchronised step reduces the accumulated sums, so K micro-steps plus one
        synchronised step equal one step on all K + 1 micro-batches. Enter it between
        steps, not after `ready` calls of a synchronised step. (If the very first `ready`
        happens inside, the one-time plan check still runs there, on every rank.)
        """
        if self._ready_count and not self._no_sync_depth:
            raise RuntimeError(
                "no_sync() entered in the middle of a synchronised step: call wait() first"
            )
        self._no_sync_depth += 1
        try:
            yield
        finally:
            self._no_sync_depth -= 1
