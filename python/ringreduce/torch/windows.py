"""A torch process group's communicator, and tensors in its windows.

``communicator(group)`` is the ringreduce communicator under a process group of the
"ringreduce" backend: its stats, windows, compression and fault tolerance, for the ranks
of that group. ``empty(*size, group=...)`` is a tensor in a window of it
(``Communicator.empty``): memory every rank of the host maps, so that
``dist.all_reduce`` on such tensors (on every rank) reads the peers' tensors where they
are instead of copying through shared memory.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch
import torch.distributed as dist

from .._comm.communicator import Communicator
from ..errors import RingReduceError
from .backend import BACKEND, ProcessGroupRingReduce

__all__ = ["communicator", "empty"]


def communicator(group: Optional[Any] = None) -> Communicator:
    """The communicator under ``group``, a process group of the "ringreduce" backend
    (None: the default group). TypeError for a group of another backend;
    RingReduceError for a group that was destroyed."""
    if group is None or group is dist.GroupMember.WORLD:
        if not dist.is_initialized():
            raise RuntimeError(
                "ringreduce.torch.communicator(): torch.distributed is not initialized; "
                'call init_process_group("ringreduce") first'
            )
        group = dist.distributed_c10d._get_default_group()
    if not isinstance(group, ProcessGroupRingReduce):
        name = _backend_name(group)
        raise TypeError(
            f"ringreduce.torch.communicator(): the group's backend is {name}, not "
            f"{BACKEND!r}: only groups of the ringreduce backend have a ringreduce communicator"
        )
    if group.destroyed:
        raise RingReduceError(
            f"rank {group.rank()}: the process group was destroyed "
            "(dist.destroy_process_group), and its communicator closed with it"
        )
    return group.comm


def empty(
    *size: Any,
    dtype: torch.dtype = torch.float32,
    device: Any = "cpu",
    group: Optional[Any] = None,
) -> torch.Tensor:
    """A tensor of ``size`` in a window of ``group``'s communicator: memory every rank of
    this host maps, zeroed. Collective over the group: every rank calls it, in the same
    order as its other collectives there, each with a shape of its own if it likes.

    ``dist.all_reduce`` (and ``comm.all_reduce``) on such tensors, passed by every rank,
    takes the window path: each rank reduces its chunk straight out of the others'
    tensors and writes it into theirs (``communicator(group).stats()
    ["all_reduce_algorithms"]["window"]`` counts these calls). Every rank must then pass
    a window tensor or none: a rank passing other memory gets MismatchError naming the
    window path. Keep the tensor while any rank may still pass it. Where the ranks do not
    all share one host this is a plain zeroed tensor.

    ``size`` as ``torch.empty`` takes it: integers, or one sequence of them.

    ``device="cuda"`` (or ``"cuda:N"``): a CUDA tensor in a device window, GPU memory
    every rank of the host maps (CUDA IPC); ``dist.all_reduce`` on such tensors
    reduces on the GPUs, each rank's chunk straight out of the others' memory, with no
    staging through the host (``Communicator.empty``).
    """
    shape = _shape(size)
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"ringreduce.torch.empty(): dtype must be a torch.dtype, got {dtype!r}")
    where = torch.device(device)
    if where.type not in ("cpu", "cuda"):
        raise TypeError(
            f"ringreduce.torch.empty(): device={str(where)!r}: windows are host memory "
            "(device='cpu') or CUDA memory (device='cuda')"
        )
    if where.type == "cuda" and not torch.cuda.is_available():
        raise TypeError(
            f"ringreduce.torch.empty(): device={str(where)!r}, but this torch "
            f"({torch.__version__}) sees no CUDA device; use device='cpu'"
        )
    comm = communicator(group)
    itemsize = torch.empty((), dtype=dtype).element_size()
    count = 1
    for n in shape:
        count *= n
    # The window as bytes, read as the dtype: no numpy dtype needed (bfloat16 included).
    if where.type == "cuda":
        index = where.index if where.index is not None else torch.cuda.current_device()
        raw = comm.empty(count * itemsize, np.uint8, device=index)
        # A view of the window's memory; it holds `raw`, and so the window, alive.
        flat = torch.as_tensor(raw, device=torch.device("cuda", index))
        if not count:
            return torch.empty(shape, dtype=dtype, device=flat.device)
        return flat.view(dtype).reshape(shape)
    raw = comm.empty(count * itemsize, np.uint8)
    flat = torch.from_numpy(raw)
    return flat.view(dtype).reshape(shape) if count else torch.empty(shape, dtype=dtype)


def _shape(size: tuple) -> tuple:
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    dims = []
    for n in size:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise ValueError(
                f"ringreduce.torch.empty(): size must be non-negative integers, got {size!r}"
            )
        dims.append(int(n))
    return tuple(dims)


def _backend_name(group: Any) -> str:
    try:
        return repr(dist.get_backend(group))
    except Exception:  # noqa: BLE001 - a group torch does not know any more
        return f"a {type(group).__name__}"
