"""The CUDA part of ringreduce as seen from Python: availability, and raw device
buffers for the GPU tests and bench/gpu_check.py (which then need neither torch
nor cupy)."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _core

__all__ = ["cuda_available", "DeviceBuffer"]


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
        self.ptr: int = int(_core.cuda_malloc_test(max(self.nbytes, 1), device))

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
            _core.cuda_memcpy_test(self.ptr + offset, array.ctypes.data, array.nbytes)

    def download(self, dtype: Any, count: int, offset: int = 0) -> np.ndarray:
        """A new host array of ``count`` elements of ``dtype`` read from ``ptr + offset``."""
        out = np.empty(count, dtype=dtype)
        if offset < 0 or offset + out.nbytes > self.nbytes:
            raise ValueError("download past the end of the buffer")
        if out.nbytes:
            _core.cuda_memcpy_test(out.ctypes.data, self.ptr + offset, out.nbytes)
        return out

    def close(self) -> None:
        """Frees the memory; further use of ``ptr`` is an error."""
        if self.ptr:
            _core.cuda_free_test(self.ptr)
            self.ptr = 0

    def __enter__(self) -> DeviceBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
