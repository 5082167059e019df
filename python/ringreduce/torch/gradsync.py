"""GradSync: data-parallel gradient averaging on top of GradientBucketer, for use
without DDP, and broadcasting parameters and optimizer state."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from .._arrays.bfloat16 import bfloat16
from ..bucketing import GradientBucketer, Handle
from ..bucketing.plan import as_dtype

__all__ = ["GradSync", "broadcast_optimizer_state", "broadcast_parameters"]


def _numpy_view(t: torch.Tensor) -> np.ndarray:
    """A numpy array sharing memory with a CPU tensor (bfloat16 via ml_dtypes)."""
    t = t.detach()
    if t.dtype == torch.bfloat16:
        # numpy has no bfloat16 of its own: reinterpret the bits as ml_dtypes.bfloat16.
        return t.view(torch.int16).numpy().view(bfloat16("a torch.bfloat16 gradient"))
    if t.dtype == torch.bool:
        return t.numpy().view(np.uint8)
    return t.numpy()


def _for_ringreduce(t: torch.Tensor) -> Any:
    """What a tensor is handed to ringreduce as: a numpy view of a CPU tensor, the tensor
    itself on a GPU (bool as uint8 bytes, which ringreduce moves unchanged)."""
    if t.is_sparse:
        raise ValueError("sparse gradients are not supported")
    if t.device.type == "cpu":
        return _numpy_view(t)
    if t.device.type != "cuda":
        raise ValueError(f"tensors on {t.device} are not supported; use CPU or CUDA tensors")
    t = t.detach()
    return t.view(torch.uint8) if t.dtype == torch.bool else t


class GradSync:
    """Averages a module's gradients over all ranks, overlapping backward.

    Registers a post-accumulate-grad hook on every parameter that requires a gradient: when
    a parameter's ``.grad`` is complete, the hook hands it to a `GradientBucketer`, whose
    buckets are all-reduced while backward continues. Call `wait` after ``backward()`` and
    before ``optimizer.step()``: then every ``.grad`` holds the average over ranks,
    identical on every rank.

    Parameters that got no gradient on this rank in a step contribute zeros; after `wait`
    their ``.grad`` holds the average too (allocated as zeros if it was None), so every
    rank applies the same update. Unlike DDP with ``find_unused_parameters``, a parameter
    unused on all ranks therefore gets a zero gradient rather than None.

    Args:
        module: the model; CPU or CUDA parameters of the dtypes the communicator supports
            (all on one device: the buckets live there).
        comm: a ringreduce Communicator.
        bucket_mb, first_bucket_mb, average, comm_dtype: as for `GradientBucketer`.
        gradient_as_bucket_view: as DDP's option of that name: after `wait`, each
            ``.grad`` is a view into its bucket (no copy back), and a backward that
            accumulates into it (``zero_grad(set_to_none=False)``) writes straight into
            the bucket (no copy in). Gradients set to None in between are copied in as
            usual. Needs ``comm_dtype`` None (the bucket must have the gradient's dtype).
        fault_tolerant, on_membership_change: as for `GradientBucketer`: a rank that dies
            during a step's all-reduces costs only its micro-batch; `comm` is then the
            survivors' communicator.
        compression, error_feedback, powersgd_rank: as for `GradientBucketer`: each
            bucket through a codec ("bf16", "int8", ..., "auto"), with error feedback kept
            per parameter name, or through rank-r PowerSGD; CPU parameters only. What
            outlives a step is in `state_dict`, to save with the model's.
        windows: as for `GradientBucketer`: buckets in windows of the communicator, whose
            all-reduce reads the peers' buckets in place. None (default): where every
            rank shares this host, for CPU parameters without compression; True: CUDA
            parameters too, their buckets in device windows reduced peer to peer.
    """

    def __init__(
        self,
        module: torch.nn.Module,
        comm: Any,
        bucket_mb: float = 25.0,
        first_bucket_mb: float = 1.0,
        average: bool = True,
        comm_dtype: Any = None,
        gradient_as_bucket_view: bool = False,
        fault_tolerant: bool = False,
        on_membership_change: Any = None,
        compression: Any = None,
        error_feedback: Any = False,
        powersgd_rank: int | None = None,
        windows: bool | None = None,
    ) -> None:
        if gradient_as_bucket_view and comm_dtype is not None:
            raise ValueError(
                "gradient_as_bucket_view needs comm_dtype=None: a gradient can only be a view "
                "of a bucket of its own dtype"
            )
        self._as_view = bool(gradient_as_bucket_view)
        self._views: list[torch.Tensor | None] = []
        self._bucketer = GradientBucketer(
            comm,
            bucket_mb=bucket_mb,
            first_bucket_mb=first_bucket_mb,
            average=average,
            comm_dtype=comm_dtype,
            fault_tolerant=fault_tolerant,
            on_membership_change=on_membership_change,
            compression=compression,
            error_feedback=error_feedback,
            powersgd_rank=powersgd_rank,
            windows=windows,
        )
        self._generation = 0  # the bucketer's, when self._views were taken
        self._params: list[tuple[Handle, torch.nn.Parameter]] = []
        for name, param in module.named_parameters():
            if not param.requires_grad:
                continue
            if param.device.type not in ("cpu", "cuda"):
                raise ValueError(
                    f"parameter {name!r} is on {param.device}; CPU and CUDA parameters are "
                    "supported"
                )
            if self._as_view and compression is not None and param.dtype == torch.float64:
                raise ValueError(
                    f"parameter {name!r}: gradient_as_bucket_view with compression needs "
                    "float32/16-bit parameters: compressed buckets of float64 are float32"
                )
            handle = self._bucketer.register(name, tuple(param.shape), as_dtype(param.dtype))
            self._params.append((handle, param))
        self._fired = [False] * len(self._params)
        self._views = [None] * len(self._params)
        self._no_sync = False
        self._hooks = [
            param.register_post_accumulate_grad_hook(self._hook(i))
            for i, (_, param) in enumerate(self._params)
        ]

    @property
    def comm(self) -> Any:
        """The communicator the gradients are reduced over (the survivors' after a
        fault-tolerant step lost a rank)."""
        return self._bucketer.comm

    def _hook(self, i: int) -> Any:
        handle = self._params[i][0]

        def hook(param: torch.Tensor) -> None:
            # Under no_sync autograd keeps accumulating into .grad by itself; the next
            # synchronised backward hands over the accumulated sum.
            if self._no_sync or param.grad is None:
                return
            self._fired[i] = True
            self._hand_over(i, handle, param.grad)

        return hook

    def _hand_over(self, i: int, handle: Handle, grad: torch.Tensor) -> None:
        generation = self._bucketer.generation()
        if self._generation != generation:
            # The buckets were allocated again (a shrink, adopt): .grad tensors that were
            # views of the old ones are copied in from there, as any other gradient.
            self._views = [None] * len(self._params)
            self._generation = generation
        view = self._views[i]
        if view is not None and grad.data_ptr() == view.data_ptr():
            self._bucketer.ready_in_bucket(handle)  # accumulated in its bucket: no copy
        else:
            self._bucketer.ready(handle, _for_ringreduce(grad), write_back=not self._as_view)

    def _bucket_view(self, handle: Handle, param: torch.Tensor) -> torch.Tensor:
        """The parameter's place in its bucket, as a tensor sharing its memory."""
        view = self._bucketer.view(handle)
        if isinstance(view, torch.Tensor):
            return view
        if view.dtype.name == "bfloat16":
            return torch.from_numpy(view.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(view)

    def adopt(self, comm: Any) -> None:
        """Goes on with ``comm`` (after a ``grow``; see `GradientBucketer.adopt`): call it
        between steps on every member, while newcomers make their GradSync on ``comm``."""
        self._bucketer.adopt(comm)

    @property
    def bucketer(self) -> GradientBucketer:
        """The underlying GradientBucketer (plan, summary, save_trace)."""
        return self._bucketer

    def wait(self) -> None:
        """Waits for every bucket; then each ``.grad`` holds the average over ranks.

        Does nothing inside `no_sync`.
        """
        if self._no_sync:
            return
        with torch.no_grad():
            for i, (handle, param) in enumerate(self._params):
                if self._fired[i]:
                    continue
                # No gradient this step on this rank: contribute zeros, and receive the
                # others' average so this replica takes the same step as theirs.
                if param.grad is None:
                    param.grad = torch.zeros_like(param, memory_format=torch.contiguous_format)
                else:
                    param.grad.zero_()
                self._hand_over(i, handle, param.grad)
        self._fired = [False] * len(self._params)
        self._bucketer.wait()
        generation = self._bucketer.generation()
        if self._generation != generation:
            self._views = [None] * len(self._params)
            self._generation = generation
        if self._as_view:
            for i, (handle, param) in enumerate(self._params):
                if self._views[i] is None:
                    self._views[i] = self._bucket_view(handle, param)
                param.grad = self._views[i]

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Gradient accumulation: backward passes inside only accumulate into ``.grad``.

        The first backward after the block reduces the accumulated gradients, as one big
        step would. Run the forward pass inside the block too, as with DDP.
        """
        previous = self._no_sync
        self._no_sync = True
        try:
            yield
        finally:
            self._no_sync = previous

    def state_dict(self) -> dict[str, Any]:
        """The bucketer's state that outlives a step (error-feedback residuals, PowerSGD's
        factors), by parameter name: this rank's own, so save one per rank."""
        return self._bucketer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores what `state_dict` saved."""
        self._bucketer.load_state_dict(state)

    def summary(self) -> dict[str, Any]:
        """The bucketer's exposed-vs-total communication summary."""
        return self._bucketer.summary()

    def save_trace(self, path: Any) -> None:
        """Writes the bucketer's chrome-trace JSON."""
        self._bucketer.save_trace(path)

    def remove(self) -> None:
        """Removes the hooks; gradients are no longer synchronised."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []


def broadcast_parameters(module: torch.nn.Module, comm: Any, root: int = 0) -> None:
    """Copies ``root``'s parameters and buffers into every rank's module, in place.

    Call it once after building the model so that all replicas start identical.
    """
    tensors = [t for _, t in module.named_parameters()] + [t for _, t in module.named_buffers()]
    with torch.no_grad():
        views = [_for_ringreduce(t) for t in tensors]
        # Issued back to back and then waited on: collectives complete in issue order,
        # so the small ones pipeline instead of paying one round trip each.
        works = [comm.broadcast(v, root=root, async_op=True) for v in views if math.prod(v.shape)]
        for work in works:
            work.wait()


class _TensorSlot:
    """Where a tensor of a broadcast state sits, with what a receiver needs to make it."""

    def __init__(self, index: int, t: torch.Tensor) -> None:
        self.index = index
        self.shape = tuple(t.shape)
        self.dtype = t.dtype


def _strip(value: Any, tensors: list) -> Any:
    """The state with each tensor replaced by a _TensorSlot (the tensors go to `tensors`)."""
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return _TensorSlot(len(tensors) - 1, value)
    if isinstance(value, dict):
        return {k: _strip(v, tensors) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_strip(v, tensors) for v in value)
    return value


def _fill(value: Any, tensors: list) -> Any:
    """_strip undone, with the tensors of `tensors`."""
    if isinstance(value, _TensorSlot):
        return tensors[value.index]
    if isinstance(value, dict):
        return {k: _fill(v, tensors) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_fill(v, tensors) for v in value)
    return value


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, comm: Any, root: int = 0) -> None:
    """Copies ``root``'s optimizer state into every rank's optimizer (as Horovod's
    ``broadcast_optimizer_state`` does): per-parameter buffers such as momentum and Adam's
    moments, step counts, and the hyperparameters of every parameter group.

    Call it after `broadcast_parameters`, for example when resuming from a checkpoint that
    only rank 0 loaded. The structure travels pickled, each tensor by a broadcast of its
    bytes (any dtype); every rank then loads it with ``optimizer.load_state_dict``.
    """
    tensors: list = []
    skeleton = _strip(optimizer.state_dict(), tensors) if comm.rank == root else None
    skeleton = comm.broadcast_object(skeleton, root=root)
    if comm.rank != root:
        tensors = []
        _collect_slots(skeleton, tensors)
    works = []
    for t in tensors:
        data = t.detach().reshape(-1).contiguous()
        if data.numel():
            works.append(comm.broadcast(data.view(torch.uint8), root=root, async_op=True))
    for work in works:
        work.wait()
    if comm.rank != root:
        optimizer.load_state_dict(_fill(skeleton, tensors))


def _collect_slots(skeleton: Any, tensors: list) -> None:
    """Empty CPU tensors for every _TensorSlot of `skeleton`, in index order."""
    slots: list = []

    def walk(value: Any) -> None:
        if isinstance(value, _TensorSlot):
            slots.append(value)
        elif isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                walk(v)

    walk(skeleton)
    for slot in sorted(slots, key=lambda s: s.index):
        tensors.append(torch.empty(slot.shape, dtype=slot.dtype))
