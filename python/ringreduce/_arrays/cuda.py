"""The CUDA part of ringreduce as seen from Python: availability, and raw device
buffers for the GPU tests and bench/gpu_check.py (which then need neither torch
nor cupy)."""

from __future__ import annotations

import math
from typing import Any, Tuple

import numpy as np

from .. import _core

__all__ = ["cuda_available", "DeviceBuffer", "DeviceArrayView"]


def cuda_available() -> bool:
    """True when ringreduce was built with CUDA and a CUDA device is usable now.

    ``build_info()["cuda"]`` says only how the extension was built; this also
    needs a driver and at least one GPU. It never raises: a missing driver or
    device reads as False.
    """
    return bool(_core.cuda_device_count() > 0)


class DeviceBuffer:
    """``nbytes`` of uninitialized memory on a CUDA device, freed by close().

    Internal helper for tests and benchmarks: ``ptr`` is the device address to
    pass to the ``_core.cuda_*`` hooks.
    """

    def __init__(self, nbytes: int, device: int = 0) -> None:
        self.nbytes = int(nbytes)
        # cudaMalloc(0) gives no address; one byte keeps ptr valid and distinct.
        self.ptr: int = int(_core.testing.cuda_malloc(max(self.nbytes, 1), device))

    @classmethod
    def from_array(cls, array: np.ndarray, device: int = 0) -> DeviceBuffer:
        """A device copy of a C-contiguous numpy array."""
        host = np.ascontiguousarray(array)
        buf = cls(host.nbytes, device)
        buf.upload(host)
        return buf

    def upload(self, array: np.ndarray, offset: int = 0) -> None:
        """Copies a C-contiguous array to ``ptr + offset``."""
        if not array.flags.c_contiguous:
            raise ValueError("upload needs a C-contiguous array")
        if offset < 0 or offset + array.nbytes > self.nbytes:
            raise ValueError("upload past the end of the buffer")
        if array.nbytes:
            _core.testing.cuda_memcpy(self.ptr + offset, array.ctypes.data, array.nbytes)

    def download(self, dtype: Any, count: int, offset: int = 0) -> np.ndarray:
        """A new host array of ``count`` elements of ``dtype`` read from ``ptr + offset``."""
        out = np.empty(count, dtype=dtype)
        if offset < 0 or offset + out.nbytes > self.nbytes:
            raise ValueError("download past the end of the buffer")
        if out.nbytes:
            _core.testing.cuda_memcpy(out.ctypes.data, self.ptr + offset, out.nbytes)
        return out

    def close(self) -> None:
        """Frees the memory; further use of ``ptr`` is an error."""
        if self.ptr:
            _core.testing.cuda_free(self.ptr)
            self.ptr = 0

    def __enter__(self) -> DeviceBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class DeviceArrayView:
    """A typed, C-contiguous view of a DeviceBuffer, exported through
    ``__cuda_array_interface__`` so the collectives accept it like a cupy array.

    Internal helper for tests and benchmarks (no torch or cupy needed). ``dtype`` is
    a numpy dtype (bfloat16 from ml_dtypes); the device is found from the pointer.
    """

    def __init__(self, buffer: DeviceBuffer, dtype: Any, shape: Tuple[int, ...]) -> None:
        self.buffer = buffer
        self.dtype = np.dtype(dtype)
        self.shape = tuple(int(n) for n in shape)
        if math.prod(self.shape) * self.dtype.itemsize > buffer.nbytes:
            raise ValueError("the view is larger than its buffer")

    @classmethod
    def from_array(cls, array: np.ndarray, device: int = 0) -> DeviceArrayView:
        """A device copy of a numpy array, viewed with its dtype and shape."""
        host = np.ascontiguousarray(array)
        return cls(DeviceBuffer.from_array(host, device), host.dtype, host.shape)

    @property
    def __cuda_array_interface__(self) -> dict:
        return {
            "shape": self.shape,
            "typestr": self.dtype.str,
            "data": (self.buffer.ptr, False),
            "strides": None,
            "version": 3,
            "stream": 1,  # the legacy default stream, where DeviceBuffer's copies run
        }

    def get(self) -> np.ndarray:
        """A host copy."""
        count = math.prod(self.shape)
        return self.buffer.download(self.dtype, count).reshape(self.shape)
