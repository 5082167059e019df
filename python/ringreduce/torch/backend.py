"""ringreduce as a torch.distributed backend: ``init_process_group("ringreduce")``.

``import ringreduce.torch`` registers the backend for CPU and CUDA tensors. Every process
group (the default one, and each ``new_group``) is a ringreduce communicator of its own,
which meets through the c10d store torch hands the backend (``env://``, ``tcp://``,
``file://``, torchrun: whatever init method made it), so the backend opens no port of
its own to meet. Every operation torch calls runs on the engine: collectives on the
communicator's ordered worker, point-to-point messages on links of their own. Work
objects and futures: `work`; the store: `store`; registration: `registration`;
``dist.shrink_group``: `shrink`.

Each operation first offers its tensors to the direct route (`direct`): dense,
contiguous tensors of a dtype the engine has go straight to it, blocking or queued, with
no shaping or staging. Anything else (other dtypes, layouts and shapes, lists of
tensors) takes the general path below, which brings the tensors to the engine and back;
both issue the same engine call for the same tensors, so a rank on either path meets a
rank on the other.
"""

from __future__ import annotations

import datetime
from typing import Any, Callable, List, Optional

import torch
import torch.distributed as dist

from .. import _core
from .._comm.communicator import Communicator
from ..errors import RingReduceError
from .direct import AVG_CODE, CODES, OP_CODES, Direct
from .shrink import Shrinking
from .store import meet
from .tensors import (
    _R,
    _bytes,
    _check_list,
    _contiguous,
    _one,
    _op_name,
    _reducible,
    _view_as,
)
from .work import _as_torch_sees_it, _Chain, _done_work, _Finished, _Watcher, _Work

__all__ = ["BACKEND", "ProcessGroupRingReduce"]

BACKEND = "ringreduce"

# ---- the process group ---------------------------------------------------------------


class _FailingWork(_Work):
    """A Work whose future fails where C++ sees it: ``set_exception`` makes the exception
    the future's *value* (raised by Python's wait() only), which DDP's reducer took for a
    result and crashed on; an error raised in a ``then`` callback is a C++ error."""

    _seen: Any = None

    def get_future(self) -> Any:
        if self._seen is None:
            self._seen = super().get_future().then(lambda f: f.value())
        return self._seen


class ProcessGroupRingReduce(Shrinking, dist.ProcessGroup):
    """A torch.distributed process group whose operations run on a ringreduce
    communicator. Made by ``init_process_group("ringreduce")`` and ``new_group``; after a
    rank died, ``dist.shrink_group`` makes one of the survivors (`shrink`)."""

    def __init__(
        self,
        store: Any,
        rank: int,
        size: int,
        timeout: datetime.timedelta,
        comm: Optional[Communicator] = None,
    ):
        """``comm``: the group's communicator when it exists already (made by `shrink`);
        else it is made here, met through ``store`` (`store.meet`)."""
        super().__init__(rank, size)
        self.comm = comm if comm is not None else meet(store, rank, size, timeout)
        self._direct = Direct(self.comm)
        # allreduce's common call, checked and issued in C (fast_path.cc): on a small
        # message the same checks in Python cost more than the engine.
        self._fast_allreduce = _core.bind_torch_allreduce(
            self.comm._issuer.gate,
            self._allreduce,
            self._queued,
            self._failed,
            CODES,
            torch.strided,
            OP_CODES,
            AVG_CODE,
        )
        self._watcher = _Watcher()
        self._name = ""
        self._desc = ""

    # -- names torch asks for ---------------------------------------------------------
    def getBackendName(self) -> str:  # noqa: N802 (torch's name)
        return BACKEND

    # A process group written in Python has no c10d Backend inside, where torch keeps a
    # group's name and description: they are kept here (DeviceMesh, FSDP2 and the
    # functional collectives find groups by name).
    def _set_group_name(self, name: str) -> None:
        self._name = name

    @property
    def group_name(self) -> str:
        if not self._name:
            raise RuntimeError("ProcessGroup name not set")
        return self._name

    def _set_group_desc(self, desc: str) -> None:
        self._desc = desc

    @property
    def group_desc(self) -> str:
        return self._desc

    def __repr__(self) -> str:
        return (
            f"<ProcessGroupRingReduce rank={self.rank()} size={self.size()} "
            f"transport={self.comm.transport!r}>"
        )

    # -- helpers ------------------------------------------------------------------------
    def _taken(self, got: Any, outputs: List[torch.Tensor]) -> Optional[_Work]:
        """The torch Work of a call the direct route took (``got``: True for a blocking
        call that ran, else the queued call's Work), or None where it did not."""
        if got is None:
            return None
        if got is True:
            return _done_work(self, outputs)
        return _FailingWork(self, [got], outputs)

    def _run(
        self,
        opts: Any,
        call: Callable[[bool], Any],
        outputs: List[torch.Tensor],
        finish: Optional[Callable[[], None]] = None,
    ) -> _Work:
        """The general path: runs ``call(async_op)``, blocking (on this thread) when torch
        says the caller waits at once, else queued; returns the torch Work."""
        if not getattr(opts, "asyncOp", True):
            try:
                call(False)
            except RingReduceError as exc:
                raise _as_torch_sees_it(exc) from None
            if finish is not None:
                finish()
            return _done_work(self, outputs)
        works = call(True)
        works = works if isinstance(works, list) else [works]
        return _FailingWork(self, [w for w in works if w is not None], outputs, finish)

    # -- all_reduce ---------------------------------------------------------------------
    def allreduce(self, tensors: List[torch.Tensor], opts: Any = None) -> Optional[_Work]:
        # One dense CPU tensor of an engine dtype: the builtin issues it (a blocking
        # call returns None once done, which torch.distributed.all_reduce takes as
        # "synced by the backend"); the rest comes back to _allreduce below.
        return self._fast_allreduce(tensors, opts)

    def _queued(self, handle: Any, tensors: List[torch.Tensor]) -> _Work:
        """The torch Work of an all_reduce the builtin queued."""
        return _FailingWork(self, [self._direct.queued(handle, tuple(tensors))], tensors)

    def _failed(self, exc: RingReduceError) -> BaseException:
        """The exception to raise for an engine error of the builtin's call."""
        return _as_torch_sees_it(self.comm._fast_failed(exc))

    def _allreduce(self, tensors: List[torch.Tensor], opts: Any = None) -> _Work:
        """allreduce's every other call: CUDA tensors, other dtypes, layouts and ops."""
        if opts is None:
            opts = dist.AllreduceOptions()
        if len(tensors) == 1:
            t = tensors[0]
            try:
                got = self._direct.all_reduce(t, opts.reduceOp, opts.asyncOp)
            except RingReduceError as exc:
                raise _as_torch_sees_it(exc) from None
            if got is True:
                work = _Finished()
                work._outputs = tensors
                return work
            if got is not None:
                return _FailingWork(self, [got], tensors)
            if t.layout == torch.sparse_coo:
                return self._sparse_allreduce(t, opts.reduceOp)
        return self._allreduce_shaped(tensors, opts.reduceOp, opts)

    def _sparse_allreduce(self, t: torch.Tensor, op: Any) -> _Work:
        """Sum of sparse COO tensors: every rank's (indices, values) gathered, then
        coalesced, in rank order on every rank (so every rank gets the same bits)."""
        if op != _R.SUM:
            raise ValueError(f"ringreduce: sparse all_reduce supports SUM only, not {op}")
        if t.is_cuda:
            raise ValueError("ringreduce: sparse all_reduce takes CPU tensors")
        c = t.coalesce()
        indices = self.comm.all_gather(c.indices().t().contiguous(), uneven=True)
        values = self.comm.all_gather(_bytes(c.values().contiguous()), uneven=True)
        values = _view_as(values, c.values().new_empty((indices.shape[0],) + c.values().shape[1:]))
        total = torch.sparse_coo_tensor(indices.t(), values, t.shape).coalesce()
        t.copy_(total)
        return _done_work(self, [t])

    def _allreduce_shaped(self, tensors: List[torch.Tensor], op: Any, opts: Any) -> _Work:
        (t,) = _one(tensors, "allreduce")
        name = _op_name(op, t.dtype)
        work_on, finish = _reducible(t)
        return self._run(
            opts,
            lambda a: self.comm.all_reduce(work_on, name, out=work_on, async_op=a),
            [t],
            finish,
        )

    def allreduce_coalesced(self, tensors: List[torch.Tensor], opts: Any = None) -> _Work:
        opts = opts if opts is not None else dist.AllreduceCoalescedOptions()
        if not tensors:
            return _done_work(self, [])
        dtype = tensors[0].dtype
        if any(t.dtype != dtype or t.device != tensors[0].device for t in tensors):
            raise ValueError("allreduce_coalesced: tensors must share one dtype and device")
        flat = torch.cat([t.reshape(-1) for t in tensors])
        name = _op_name(opts.reduceOp, dtype)
        work_on, widen_back = _reducible(flat)

        def finish() -> None:
            if widen_back is not None:
                widen_back()
            at = 0
            for t in tensors:
                t.copy_(flat[at : at + t.numel()].view_as(t))
                at += t.numel()

        return self._run(
            opts,
            lambda a: self.comm.all_reduce(work_on, name, out=work_on, async_op=a),
            tensors,
            finish,
        )

    # -- broadcast / reduce ---------------------------------------------------------------
    def broadcast(self, tensors: List[torch.Tensor], opts: Any = None) -> _Work:
        opts = opts if opts is not None else dist.BroadcastOptions()
        (t,) = _one(tensors, "broadcast")
        taken = self._taken(self._call_direct("broadcast", t, opts.rootRank, opts.asyncOp), [t])
        if taken is not None:
            return taken
        buf = _bytes(t) if t.is_contiguous() else t
        return self._run(
            opts, lambda a: self.comm.broadcast(buf, root=opts.rootRank, async_op=a), [t]
        )

    def reduce(self, tensors: List[torch.Tensor], opts: Any = None) -> _Work:
        opts = opts if opts is not None else dist.ReduceOptions()
        (t,) = _one(tensors, "reduce")
        root = opts.rootRank
        got = self._call_direct("reduce", t, opts.reduceOp, root, opts.asyncOp)
        taken = self._taken(got, [t])
        if taken is not None:
            return taken
        name = _op_name(opts.reduceOp, t.dtype)
        work_on, finish = _reducible(t)
        out = work_on if self.rank() == root else None
        return self._run(
            opts,
            lambda a: self.comm.reduce(work_on, name, root, out=out, async_op=a),
            [t],
            finish if self.rank() == root else None,
        )

    def _call_direct(self, method: str, *args: Any) -> Any:
        """The direct route's ``method(*args)``, its errors as torch sees them."""
        try:
            return getattr(self._direct, method)(*args)
        except RingReduceError as exc:
            raise _as_torch_sees_it(exc) from None

    # -- gathers ----------------------------------------------------------------------
    def allgather(
        self,
        output_tensors: List[List[torch.Tensor]],
        input_tensors: List[torch.Tensor],
        opts: Any = None,
    ) -> _Work:
        opts = opts if opts is not None else dist.AllgatherOptions()
        (x,) = _one(input_tensors, "allgather")
        (outs,) = _one(output_tensors, "allgather")
        _check_list(outs, self.size(), x, "allgather")
        src = _bytes(_contiguous(x))
        staging = src.new_empty((self.size(),) + tuple(src.shape))

        def finish() -> None:
            for r, o in enumerate(outs):
                o.copy_(_view_as(staging[r], o))

        return self._run(
            opts, lambda a: self.comm.all_gather(src, out=staging, async_op=a), outs, finish
        )

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None):
        opts = opts if opts is not None else dist.AllgatherOptions()
        taken = self._taken(self._call_direct("all_gather", output, input, opts.asyncOp), [output])
        if taken is not None:
            return taken
        if output.numel() != input.numel() * self.size():
            raise ValueError(
                f"all_gather_into_tensor: output has {output.numel()} elements, expected "
                f"{self.size()} x {input.numel()}"
            )
        src = _bytes(_contiguous(input))
        if output.is_contiguous():
            dst = _bytes(output).reshape((self.size(),) + tuple(src.shape))
            return self._run(
                opts, lambda a: self.comm.all_gather(src, out=dst, async_op=a), [output]
            )
        staging = src.new_empty((self.size(),) + tuple(src.shape))
        return self._run(
            opts,
            lambda a: self.comm.all_gather(src, out=staging, async_op=a),
            [output],
            lambda: output.copy_(_view_as(staging, output)),
        )

    _allgather_base = all_gather_single

    def allgather_coalesced(
        self,
        output_lists: List[List[torch.Tensor]],
        input_list: List[torch.Tensor],
        opts: Any = None,
    ) -> _Work:
        # output_lists[r][i]: rank r's tensor i.
        opts = opts if opts is not None else dist.AllgatherOptions()
        if len(output_lists) != self.size():
            raise ValueError(
                f"allgather_coalesced: {self.size()} output lists (one per rank) expected"
            )
        works = [
            self.allgather([[outs[i] for outs in output_lists]], [x], opts)
            for i, x in enumerate(input_list)
        ]
        return _Chain(self, works, [t for outs in output_lists for t in outs])

    def all_gather_single_coalesced(
        self, outputs: List[torch.Tensor], inputs: List[torch.Tensor], opts: Any = None
    ) -> _Work:
        opts = opts if opts is not None else dist.AllgatherOptions()
        works = [self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return _Chain(self, works, list(outputs))

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def gather(
        self,
        output_tensors: List[List[torch.Tensor]],
        input_tensors: List[torch.Tensor],
        opts: Any = None,
    ) -> _Work:
        opts = opts if opts is not None else dist.GatherOptions()
        (x,) = _one(input_tensors, "gather")
        root = opts.rootRank
        src = _bytes(_contiguous(x))
        if self.rank() != root:
            return self._run(opts, lambda a: self.comm.gather(src, root, async_op=a), [])
        (outs,) = _one(output_tensors, "gather")
        _check_list(outs, self.size(), x, "gather")
        staging = src.new_empty((self.size(),) + tuple(src.shape))

        def finish() -> None:
            for r, o in enumerate(outs):
                o.copy_(_view_as(staging[r], o))

        return self._run(
            opts, lambda a: self.comm.gather(src, root, out=staging, async_op=a), outs, finish
        )

    def scatter(
        self,
        output_tensors: List[torch.Tensor],
        input_tensors: List[List[torch.Tensor]],
        opts: Any = None,
    ) -> _Work:
        opts = opts if opts is not None else dist.ScatterOptions()
        (out,) = _one(output_tensors, "scatter")
        root = opts.rootRank
        dst = _bytes(out) if out.is_contiguous() else out.new_empty(out.shape)
        finish = None
        if dst is not out and dst.data_ptr() != out.data_ptr():
            finish = lambda: out.copy_(dst)  # noqa: E731
        if self.rank() == root:
            (ins,) = _one(input_tensors, "scatter")
            _check_list(ins, self.size(), out, "scatter")
            src = torch.stack([_bytes(_contiguous(t)).reshape(dst.shape) for t in ins])
            call = lambda a: self.comm.scatter(src, root, out=dst, async_op=a)  # noqa: E731
        else:
            call = lambda a: self.comm.scatter(None, root, out=dst, async_op=a)  # noqa: E731
        return self._run(opts, call, [out], finish)

    # -- reduce_scatter -------------------------------------------------------------------
    def reduce_scatter(
        self,
        output_tensors: List[torch.Tensor],
        input_tensors: List[List[torch.Tensor]],
        opts: Any = None,
    ) -> _Work:
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        (out,) = _one(output_tensors, "reduce_scatter")
        (ins,) = _one(input_tensors, "reduce_scatter")
        _check_list(ins, self.size(), out, "reduce_scatter")
        flat = torch.cat([t.reshape(-1) for t in ins])
        return self._reduce_scatter_flat(out, flat, opts)

    def reduce_scatter_single(
        self, output: torch.Tensor, input: torch.Tensor, opts: Any = None
    ) -> _Work:
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        got = self._call_direct("reduce_scatter", output, input, opts.reduceOp, opts.asyncOp)
        taken = self._taken(got, [output])
        if taken is not None:
            return taken
        if input.numel() != output.numel() * self.size():
            raise ValueError(
                f"reduce_scatter_tensor: input has {input.numel()} elements, expected "
                f"{self.size()} x {output.numel()}"
            )
        return self._reduce_scatter_flat(output, _contiguous(input).reshape(-1), opts)

    _reduce_scatter_base = reduce_scatter_single

    def _reduce_scatter_flat(self, out: torch.Tensor, flat: torch.Tensor, opts: Any) -> _Work:
        name = _op_name(opts.reduceOp, out.dtype)
        work_on, _ = _reducible(flat)
        if out.is_complex():  # (re, im) pairs: the real view of out holds 2 values each
            o = _contiguous(out)
            dst = torch.view_as_real(o).reshape(-1)
            return self._run(
                opts,
                lambda a: self.comm.reduce_scatter(work_on, name, out=dst, async_op=a),
                [out],
                None if o is out else (lambda: out.copy_(o)),
            )
        wide = work_on.dtype != out.dtype
        if out.is_contiguous() and not wide:
            dst = out.reshape(-1)
            return self._run(
                opts, lambda a: self.comm.reduce_scatter(work_on, name, out=dst, async_op=a), [out]
            )
        dst = work_on.new_empty((out.numel(),))
        return self._run(
            opts,
            lambda a: self.comm.reduce_scatter(work_on, name, out=dst, async_op=a),
            [out],
            lambda: out.copy_(dst.view(out.shape).to(out.dtype)),
        )

    def reduce_scatter_single_coalesced(
        self, outputs: List[torch.Tensor], inputs: List[torch.Tensor], opts: Any = None
    ) -> _Work:
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        works = [self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return _Chain(self, works, list(outputs))

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # -- all_to_all -----------------------------------------------------------------------
    def alltoall(
        self,
        output_tensors: List[torch.Tensor],
        input_tensors: List[torch.Tensor],
        opts: Any = None,
    ) -> _Work:
        opts = opts if opts is not None else dist.AllToAllOptions()
        n = self.size()
        if len(output_tensors) != n or len(input_tensors) != n:
            raise ValueError(f"alltoall: lists of {n} tensors expected")
        ins = [_bytes(_contiguous(t)).reshape(-1) for t in input_tensors]
        flat_in = torch.cat(ins) if ins else torch.empty(0)
        recv_counts = [_bytes(_contiguous(t)).numel() for t in output_tensors]
        flat_out = flat_in.new_empty((sum(recv_counts),))

        def finish() -> None:
            at = 0
            for t, c in zip(output_tensors, recv_counts):
                t.copy_(_view_as(flat_out[at : at + c], t))
                at += c

        send_counts = [t.numel() for t in ins]
        return self._run(
            opts,
            lambda a: self.comm.all_to_all(
                flat_in,
                out=flat_out,
                send_counts=send_counts,
                recv_counts=recv_counts,
                async_op=a,
            ),
            list(output_tensors),
            finish,
        )

    def alltoall_base(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: List[int],
        input_split_sizes: List[int],
        opts: Any = None,
    ) -> _Work:
        opts = opts if opts is not None else dist.AllToAllOptions()
        n = self.size()
        if (
            not output_split_sizes
            and not input_split_sizes
            and input.dim()
            and input.shape[0] % n == 0
            and output.dim()
            and output.shape[0] == input.shape[0]
        ):
            got = self._call_direct("all_to_all", output, input, opts.asyncOp)
            taken = self._taken(got, [output])
            if taken is not None:
                return taken
        src = _bytes(_contiguous(input))
        rows_in = input.shape[0] if input.dim() else 1
        rows_out = output.shape[0] if output.dim() else 1
        src = src.reshape(rows_in, -1) if src.numel() else src.reshape(rows_in, 0)
        dst = output if output.is_contiguous() else output.new_empty(output.shape)
        dstb = _bytes(dst)
        dstb = dstb.reshape(rows_out, -1) if dstb.numel() else dstb.reshape(rows_out, 0)
        finish = None if dst is output else (lambda: output.copy_(dst))
        if not output_split_sizes and not input_split_sizes:
            if rows_in % n:
                raise ValueError(f"all_to_all_single: {rows_in} rows do not split into {n} ranks")
            sends = recvs = None
        else:
            sends = list(input_split_sizes) or [rows_in // n] * n
            recvs = list(output_split_sizes) or [rows_out // n] * n
        return self._run(
            opts,
            lambda a: self.comm.all_to_all(
                src, out=dstb, send_counts=sends, recv_counts=recvs, async_op=a
            ),
            [output],
            finish,
        )

    all_to_all_single = alltoall_base

    # -- barrier ------------------------------------------------------------------------
    def barrier(self, opts: Any = None) -> _Work:
        opts = opts if opts is not None else dist.BarrierOptions()
        token = torch.zeros(1, dtype=torch.uint8)
        taken = self._taken(self._call_direct("all_reduce", token, _R.SUM, opts.asyncOp), [])
        if taken is not None:
            return taken
        return self._run(opts, lambda a: self.comm.all_reduce(token, out=token, async_op=a), [])

    # -- point-to-point -----------------------------------------------------------------
    def send(self, tensors: List[torch.Tensor], dst: int, tag: int) -> _Work:
        (t,) = _one(tensors, "send")
        host = _contiguous(t.detach()).cpu() if t.is_cuda else _contiguous(t)
        work = self.comm.send(_bytes(host), dst, tag=tag, async_op=True)
        return _Work(self, [work], [t])

    def recv(self, tensors: List[torch.Tensor], src: int, tag: int) -> _Work:
        return self._recv(tensors, src, tag)

    def recv_anysource(self, tensors: List[torch.Tensor], tag: int) -> _Work:
        return self._recv(tensors, None, tag)

    def _recv(self, tensors: List[torch.Tensor], src: Optional[int], tag: int) -> _Work:
        (t,) = _one(tensors, "recv")
        direct = not t.is_cuda and t.is_contiguous()
        host = t if direct else torch.empty(t.shape, dtype=t.dtype)
        work = self.comm.recv(_bytes(host), src, tag=tag, async_op=True)
        finish = None if direct else (lambda: t.copy_(host))
        return _Work(self, [work], [t], finish, source=lambda: work.wait())

    # -- lifetime -----------------------------------------------------------------------
    destroyed = False
    """True once the group was destroyed (``dist.destroy_process_group``): its
    communicator is closed."""

    def shutdown(self) -> None:
        self.destroyed = True
        self._watcher.stop()
        self.comm.close()

    def abort(self) -> None:
        """Fails every in-flight and queued collective of this rank now (from any thread),
        tells the peers, and closes: what torchft calls when a replica fails."""
        self.comm.abort()
        self.shutdown()
