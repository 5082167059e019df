"""Memory the ranks of a host read from each other: ``Communicator.empty``
(MPI_Win_allocate_shared's idea, NCCL's registered user buffers).

An all_reduce whose input and output come from ``empty`` on every rank reads the
peers' inputs where they are: each rank reduces its chunk straight out of every
rank's input and writes it into every rank's output. One copy, where the ring copies
every message into shared memory and out again (the engine's
algorithms/window_all_reduce.h).

With ``device="cuda"`` the window is GPU memory that every rank of the host maps
(CUDA IPC), and the chunk is reduced by the GPU straight out of the peers' device
memory, with no staging through the host (executor/device_window.h).
"""

from __future__ import annotations

import math
import sys
from typing import Any, Optional, Sequence, Tuple, Union

import numpy as np

from ... import _core

__all__ = ["empty", "DeviceWindowArray"]


def empty(comm: Any, shape: Union[int, Sequence[int]], dtype: Any, device: Any = None) -> Any:
    """``comm.empty``: a zeroed array in a window of ``comm`` (collective): numpy
    for host memory, a DeviceWindowArray for ``device="cuda"``; where the ranks do
    not all share this host, memory of this rank's alone."""
    dt = np.dtype(dtype)
    dims = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    if not all(isinstance(d, (int, np.integer)) and d >= 0 for d in dims):
        raise ValueError(f"shape must be non-negative integers, got {shape!r}")
    dims = tuple(int(d) for d in dims)
    count = int(np.prod(dims, dtype=np.int64))
    nbytes = count * dt.itemsize
    index = cuda_index(device)
    if index is not None:
        window = comm._issue(
            _core.Collective.ALL_GATHER,
            comm._core.allocate_device_window,
            max(nbytes, dt.itemsize, 1),
            index,
        )
        return DeviceWindowArray(window, dt, dims)
    window = comm._issue(
        _core.Collective.ALL_GATHER, comm._core.allocate_window, max(nbytes, dt.itemsize, 1)
    )
    if window is None:
        return np.zeros(dims, dt)
    return np.frombuffer(window, dtype=dt, count=count).reshape(dims)


def cuda_index(device: Any) -> Optional[int]:
    """None for host memory (None, "cpu"), else the CUDA device's index: "cuda:N" or N;
    "cuda" alone is the current device (torch's where torch is loaded, else 0)."""
    if device is None:
        return None
    if isinstance(device, (int, np.integer)) and not isinstance(device, bool):
        if device < 0:
            raise ValueError(f"device must be a CUDA device index >= 0, got {device}")
        return int(device)
    text = str(device)  # a torch.device too
    if text == "cpu":
        return None
    if text == "cuda":
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            return int(torch.cuda.current_device())
        return 0
    kind, _, number = text.partition(":")
    if kind == "cuda" and number.isdigit():
        return int(number)
    raise ValueError(f"device must be None, 'cpu', 'cuda', 'cuda:N' or an index, got {device!r}")


class _CudaDevice:
    """Where a DeviceWindowArray lives, as cupy's ``Device``: ``.id``."""

    def __init__(self, index: int) -> None:
        self.id = index

    def __repr__(self) -> str:
        return f"cuda:{self.id}"


class DeviceWindowArray:
    """An array in a device window: GPU memory every rank of the host maps.

    Exported through ``__cuda_array_interface__``, so ``torch.as_tensor(a,
    device="cuda")`` and ``cupy.asarray(a)`` are views of the same memory, and every
    collective takes it (or those views) as any CUDA array. An ``all_reduce`` whose
    input and output lie in such arrays on every rank reduces on the GPUs, each rank's
    chunk straight out of the peers' memory. The memory stays mapped while this
    object, or a view holding it, lives.
    """

    def __init__(self, window: Any, dtype: np.dtype, shape: Tuple[int, ...]) -> None:
        self.window = window
        self.dtype = np.dtype(dtype)
        self.shape = tuple(shape)
        self.device = _CudaDevice(int(window.device))

    @property
    def ptr(self) -> int:
        """The device address of the first element."""
        return int(self.window.ptr)

    @property
    def shared(self) -> bool:
        """True when every rank of the host maps it (the window path); False where the
        ranks span hosts, or some rank's GPU has no peer access to another's
        (``window.unshared_reason`` says which): memory of this rank's alone, whose
        all_reduce is staged through the host."""
        return bool(self.window.id) and bool(self.window.shared)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d array")
        return self.shape[0]

    @property
    def __cuda_array_interface__(self) -> dict:
        return {
            "shape": self.shape,
            "typestr": self.dtype.str,
            "data": (self.ptr, False),
            "strides": None,
            "version": 3,
            # No "stream": the zeros were in place before empty() returned.
        }

    def __repr__(self) -> str:
        return (
            f"DeviceWindowArray(shape={self.shape}, dtype={self.dtype.name}, "
            f"device={self.device!r}, window={self.window.id})"
        )
