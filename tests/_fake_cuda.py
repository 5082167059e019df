"""A numpy array posing as CUDA memory, for tests of the CUDA path without a GPU."""

from __future__ import annotations

import types
from typing import Any, Optional

import numpy as np

# The engine's private switch: its Device becomes the CPU emulation
# (csrc/engine/fake_device.cc), which treats "device" pointers as host memory.
FAKE_DEVICE_ENV = {"RINGREDUCE_TEST_FAKE_DEVICE": "1"}


class FakeCudaArray:
    """Exports ``__cuda_array_interface__`` with the host address of a numpy array.

    Like a cupy array, it carries ``dtype`` and ``device.id``. Only meaningful
    where RINGREDUCE_TEST_FAKE_DEVICE=1: a real GPU would be handed a host
    pointer as device memory.
    """

    def __init__(
        self,
        array: np.ndarray,
        *,
        device: int = 0,
        stream: Optional[int] = None,
        readonly: bool = False,
    ) -> None:
        self.array = array
        self.dtype = array.dtype
        self.device = types.SimpleNamespace(id=device)
        self._stream = stream
        self._readonly = readonly

    @property
    def shape(self) -> tuple:
        return self.array.shape

    @property
    def __cuda_array_interface__(self) -> dict:
        a = self.array
        cai: dict[str, Any] = {
            "shape": a.shape,
            "typestr": a.dtype.str,
            "data": (a.__array_interface__["data"][0], self._readonly),
            "strides": None if a.flags.c_contiguous else a.strides,
            "version": 3,
        }
        if self._stream is not None:
            cai["stream"] = self._stream
        return cai


def fake(array: np.ndarray, **kwargs: Any) -> FakeCudaArray:
    """Shorthand for FakeCudaArray(array)."""
    return FakeCudaArray(array, **kwargs)
