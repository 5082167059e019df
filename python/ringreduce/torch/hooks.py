"""DDP communication hooks that compress on the ringreduce backend.

On a DDP model whose process group is a "ringreduce" group (``init_process_group(
"ringreduce")`` or ``new_group(backend="ringreduce")``)::

    ddp.register_comm_hook(None, rr.torch.hooks.bf16_hook)          # 16 bits, sums in fp32
    ddp.register_comm_hook(rr.torch.hooks.Int8State(model=model), rr.torch.hooks.int8_hook)
    ddp.register_comm_hook(rr.torch.hooks.PowerSGDState(rank=4, model=model),
                           rr.torch.hooks.powersgd_hook)

Each hook returns a ``torch.futures.Future`` of the bucket's averaged tensor, as DDP
asks. The state is the process group (None: the default group) for `bf16_hook`, and a
state object for the others, which keeps what must outlive a step: the error-feedback
residuals, PowerSGD's warm-start factors. Both are kept by parameter *name* (from
``model=``), so DDP's rebuilding of its buckets after the first step loses nothing, and
both save and load with ``state_dict()`` / ``load_state_dict()``.

Unlike torch's ``bf16_compress_hook`` (NCCL only) and ``powerSGD_hook`` (whose second
all-reduce is issued from a future's callback thread, which Gloo can match with another
bucket's call), these run on CPU tensors and issue every collective from the thread
that runs the hooks, in bucket order, so every rank issues them in the same order.
"""

import concurrent.futures
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import numpy as np
import torch
import torch.distributed as dist
from torch.futures import Future

from .._comm.communicator import Communicator
from ..compression.feedback import ErrorFeedback
from ..compression.powersgd import PowerSGD, PowerSGDWork, QInit
from .tensors import _op_name

__all__ = [
    "FSDPReduceScatter",
    "Int8State",
    "PowerSGDState",
    "bf16_hook",
    "communicator_of",
    "int8_hook",
    "powersgd_hook",
]


def communicator_of(group: Any = None) -> Communicator:
    """The ringreduce `Communicator` under a torch process group of the "ringreduce"
    backend (None: the default group); a Communicator is returned as it is."""
    if isinstance(group, Communicator):
        return group
    pg = group if group is not None else dist.group.WORLD
    comm = getattr(pg, "comm", None)
    if not isinstance(comm, Communicator):
        backend = pg.name() if hasattr(pg, "name") else type(pg).__name__
        raise TypeError(
            f"ringreduce hooks run on a process group of the 'ringreduce' backend, not "
            f"{backend!r}: make the group with init_process_group('ringreduce') or "
            "new_group(backend='ringreduce'), or use torch's own default_hooks elsewhere"
        )
    return comm


# ---- futures ---------------------------------------------------------------------------

# Hook futures whose collective is still running are completed by this one thread, in
# the order they were handed over (collectives of one communicator finish in issue
# order, so none waits behind a later one), and their callbacks run on a small pool, as
# the backend's own futures do, so that a callback may wait on another collective.
_waiter = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="rr-hooks")
_callbacks = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="rr-hook-cb")


def _settle(fut: Future, make: Callable[[], torch.Tensor]) -> None:
    try:
        value = make()
    except BaseException as exc:  # the future carries it to DDP, which raises it
        _callbacks.submit(fut.set_exception, exc)
        return
    _callbacks.submit(fut.set_result, value)


def _future(make: Callable[[], torch.Tensor], now: bool) -> Future[torch.Tensor]:
    """A future of ``make()``: run here when ``now`` (the work is done already), else by
    the waiter thread. ``make`` must issue no collective when not run ``now``."""
    fut: Future[torch.Tensor] = Future()
    if now:
        try:
            fut.set_result(make())
        except BaseException as exc:
            fut.set_exception(exc)
    else:
        _waiter.submit(_settle, fut, make)
    return fut


# ---- the bucket as the engine takes it ---------------------------------------------------


def _host(buf: torch.Tensor) -> Tuple[torch.Tensor, Callable[[], None]]:
    """The bucket as the codecs take it: in host memory, float32 for a float64 bucket
    (the codecs sum in float32); itself, or a copy and what copies the result back."""
    if buf.device.type == "cpu" and buf.is_contiguous() and buf.dtype != torch.float64:
        return buf, lambda: None
    dtype = torch.float32 if buf.dtype == torch.float64 else buf.dtype
    host = buf.detach().to("cpu", dtype).contiguous()
    return host, lambda: buf.copy_(host)


class _Names:
    """Parameter names of buckets: from ``model.named_parameters()``, else given in the
    order parameters are first seen ("p0", "p1", ...), which is the same on every rank
    and in every run of one program."""

    def __init__(self, model: Optional[torch.nn.Module]):
        self._by_id: Dict[int, Tuple[torch.Tensor, str]] = {}
        if model is not None:
            for name, p in model.named_parameters():
                self._by_id[id(p)] = (p, name)

    def of(self, params: List[torch.Tensor]) -> List[str]:
        names = []
        for p in params:
            known = self._by_id.get(id(p))
            if known is None or known[0] is not p:
                known = self._by_id[id(p)] = (p, f"p{len(self._by_id)}")
            names.append(known[1])
        return names


# ---- bf16 --------------------------------------------------------------------------------


def bf16_hook(process_group: Any, bucket: dist.GradBucket) -> Future[torch.Tensor]:
    """Averages the bucket with 16 bits per value on the wire (bfloat16) and sums in
    float32 (``comm.all_reduce(x, "avg", compression="bf16")``): each value is rounded
    once on its way and the sum once, instead of the rounding at every hop of a sum kept
    in bfloat16. State: the process group (None: the default group)."""
    comm = communicator_of(process_group)
    buf = bucket.buffer()
    host, back = _host(buf)
    work = comm.all_reduce(host, "avg", out=host, async_op=True, compression="bf16")

    def make() -> torch.Tensor:
        work.wait()
        back()
        return buf

    return _future(make, work.done())


# ---- int8 with error feedback --------------------------------------------------------------


class Int8State:
    """State of `int8_hook`: the group, the codec ("int8", or "int4") and the error
    feedback, kept per parameter so that it survives DDP's re-bucketing.

    Args:
        process_group: a "ringreduce" group (None: the default group).
        error_feedback: True (a new `ErrorFeedback`), an `ErrorFeedback` to keep the
            residuals in (e.g. one saved with the training state), or False/None.
        model: the model (or the DDP module) whose parameter names key the residuals.
        codec: "int8" (one scale per block, 8 bits a value) or "int4".
    """

    def __init__(
        self,
        process_group: Any = None,
        *,
        error_feedback: Union[bool, ErrorFeedback, None] = True,
        model: Optional[torch.nn.Module] = None,
        codec: str = "int8",
    ):
        self.process_group = process_group
        self.comm = communicator_of(process_group)
        self.codec = codec
        if error_feedback is True:
            error_feedback = ErrorFeedback()
        self.error_feedback: Optional[ErrorFeedback] = error_feedback or None
        self._names = _Names(model)
        # Where each parameter's residual lives: the bucket key (its parameters' names)
        # and the parameter's (offset, size) in that bucket.
        self._home: Dict[str, Tuple[str, int, int]] = {}
        self._sizes: Dict[str, int] = {}  # bucket key -> its residual's length

    def _key(self, bucket: dist.GradBucket) -> Optional[ErrorFeedback]:
        """The bucket's view of the error feedback. A bucket of parameters seen before in
        other buckets (DDP rebuilt its buckets) takes their residuals over, by name."""
        if self.error_feedback is None:
            return None
        names = self._names.of(bucket.parameters())
        key = "|".join(names)
        sizes = [g.numel() for g in bucket.gradients()]
        view = self.error_feedback.key(key)
        if key in self.error_feedback.keys():
            return view
        residual = view.residual(sum(sizes))
        self._sizes[key] = sum(sizes)
        moved, at = set(), 0
        for name, size in zip(names, sizes):
            old = self._home.get(name)
            if old is not None and old[0] != key and old[0] in self.error_feedback.keys():
                was = self.error_feedback.key(old[0]).residual(self._sizes[old[0]])
                residual[at : at + size] = was[old[1] : old[1] + size]
                moved.add(old[0])
            self._home[name] = (key, at, size)
            at += size
        # An old bucket is dropped once none of its parameters lives there any more.
        for old_key in moved:
            if all(home[0] != old_key for home in self._home.values()):
                self.error_feedback.key(old_key).reset()
                del self._sizes[old_key]
        return view

    def state_dict(self) -> dict:
        """The residuals (this rank's own) and where each parameter's lives."""
        ef = self.error_feedback.state_dict() if self.error_feedback is not None else None
        return {
            "version": 1,
            "error_feedback": ef,
            "home": dict(self._home),
            "sizes": dict(self._sizes),
        }

    def load_state_dict(self, state: dict) -> None:
        if state.get("version") != 1:
            raise ValueError(f"Int8State: unknown state version {state.get('version')!r}")
        if state["error_feedback"] is not None:
            if self.error_feedback is None:
                self.error_feedback = ErrorFeedback()
            self.error_feedback.load_state_dict(state["error_feedback"])
        self._home = {k: tuple(v) for k, v in state["home"].items()}  # type: ignore[misc]
        self._sizes = dict(state["sizes"])


def int8_hook(state: Int8State, bucket: dist.GradBucket) -> Future[torch.Tensor]:
    """Averages the bucket with int8 codes (one scale per block) on the wire, sums in
    float32, and carries what the codes dropped into the next step (error feedback), so
    that over steps no gradient is lost. State: an `Int8State`."""
    buf = bucket.buffer()
    host, back = _host(buf)
    key = state._key(bucket)
    work = state.comm.all_reduce(
        host, "avg", out=host, async_op=True, compression=state.codec, error_feedback=key
    )

    def make() -> torch.Tensor:
        work.wait()
        back()
        return buf

    return _future(make, work.done())


# ---- PowerSGD ------------------------------------------------------------------------------


class PowerSGDState:
    """State of `powersgd_hook`: a `PowerSGD` over the group's communicator, keyed by
    parameter name (residuals and warm-start Q survive re-bucketing, so compression may
    start at step 0, where torch's hook needs ``start_powerSGD_iter`` >= 2).

    Args:
        process_group: a "ringreduce" group (None: the default group).
        rank: the approximation rank (torch's ``matrix_approximation_rank``).
        start_iter: steps a parameter is averaged exactly before it is compressed
            (torch suggests about 10% of training).
        model: the model (or DDP module) whose parameter names key the state.
        warm_start, error_feedback, min_compression_rate, seed, epsilon, q_init:
            as `ringreduce.compression.powersgd.PowerSGD`.
    """

    def __init__(
        self,
        process_group: Any = None,
        rank: int = 1,
        *,
        start_iter: int = 0,
        model: Optional[torch.nn.Module] = None,
        warm_start: bool = True,
        error_feedback: bool = True,
        min_compression_rate: float = 2.0,
        seed: int = 0,
        epsilon: float = 0.0,
        q_init: Optional[QInit] = None,
    ):
        self.process_group = process_group
        self.comm = communicator_of(process_group)
        self.powersgd = PowerSGD(
            self.comm,
            rank,
            warm_start=warm_start,
            error_feedback=error_feedback,
            min_compression_rate=min_compression_rate,
            start_iter=start_iter,
            seed=seed,
            epsilon=epsilon,
            q_init=q_init,
        )
        self._names = _Names(model)
        # Buckets whose P all-reduce is issued and whose Q all-reduce is not yet: the
        # next bucket's hook (or the last bucket's) issues it, on the hooks' thread.
        self._open: List[Tuple[PowerSGDWork, Callable[[], torch.Tensor], Future]] = []

    def stats(self) -> dict:
        """`PowerSGD.stats`: elements given, elements sent, the rate."""
        return self.powersgd.stats()

    def state_dict(self) -> dict:
        return self.powersgd.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.powersgd.load_state_dict(state)


def _float32_views(grads: List[torch.Tensor]) -> Tuple[List[np.ndarray], Callable[[], None]]:
    """numpy float32 arrays of the bucket's gradients: views of CPU float32 tensors, or
    copies (other dtypes and devices) with what writes them back."""
    if all(g.device.type == "cpu" and g.dtype == torch.float32 for g in grads):
        return [g.detach().numpy() for g in grads], lambda: None
    copies = [g.detach().to("cpu", torch.float32).numpy() for g in grads]

    def back() -> None:
        for g, c in zip(grads, copies):
            g.copy_(torch.from_numpy(c))

    return copies, back


def powersgd_hook(state: PowerSGDState, bucket: dist.GradBucket) -> Future[torch.Tensor]:
    """Averages the bucket by PowerSGD: its matrices as rank-r factors P and Q (two
    all-reduces), the rest exactly. State: a `PowerSGDState`.

    Overlap: this bucket's P all-reduce is issued first, then the previous bucket's P is
    waited for, orthogonalized and its Q all-reduce issued, so that work runs while this
    P is on the wire and that Q goes out behind it; the last bucket issues its own Q too.
    """
    buf = bucket.buffer()
    grads = bucket.gradients()
    arrays, back = _float32_views(grads)
    names = state._names.of(bucket.parameters())
    work = state.powersgd.start(arrays, names)  # also issues earlier buckets' Q

    def make() -> torch.Tensor:
        work.wait()
        back()
        return buf

    fut: Future[torch.Tensor] = Future()
    state._open.append((work, make, fut))
    if bucket.is_last():
        work.advance()
    # Every bucket whose collectives are all issued now finishes on the waiter thread.
    still = []
    for w, mk, f in state._open:
        if w.issued():
            _waiter.submit(_settle, f, mk)
        else:
            still.append((w, mk, f))
    state._open = still
    return fut


# ---- FSDP2 -------------------------------------------------------------------------------


class FSDPReduceScatter:
    """A compressed reduce-scatter for FSDP2 (``fully_shard``), which torch 2.13 lets a
    module take instead of its own (``module.set_custom_reduce_scatter(comm)``)::

        for layer in layers:
            fully_shard(layer, mesh=mesh)          # mesh over a "ringreduce" group
            layer.set_custom_reduce_scatter(FSDPReduceScatter("int8", error_feedback=True))

    Each module reduce-scatters its gradients once per backward through
    ``comm.reduce_scatter(x, op, compression=codec, error_feedback=...)``: 16 or 8 bits
    on the wire, sums in float32. Give each module its own instance: its error feedback
    holds that module's residual (True: a new `ErrorFeedback`; or a view such as
    ``ef.key("layers.0")`` to keep every module's in one object and checkpoint it).
    Host memory only (a CUDA gradient is copied to the host and back).
    """

    def __init__(
        self, codec: str = "bf16", error_feedback: Union[bool, ErrorFeedback, None] = None
    ):
        self.codec = codec
        self.error_feedback: Optional[ErrorFeedback] = (
            ErrorFeedback() if error_feedback is True else (error_feedback or None)
        )

    def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """FSDP's buffers for the call: plain tensors."""
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: Any,
        op: Any,
        async_op: bool = False,
    ) -> None:
        """Reduce-scatters input_tensor into output_tensor (this rank's block), blocking:
        FSDP calls it on its reduce-scatter stream and reads the output afterwards."""
        comm = communicator_of(group)
        name = _op_name(op, input_tensor.dtype)
        src, _ = _host(input_tensor)
        dst, back = _host(output_tensor)
        comm.reduce_scatter(
            src, name, out=dst, compression=self.codec, error_feedback=self.error_feedback
        )
        back()
