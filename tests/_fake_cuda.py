"""A numpy array posing as CUDA memory, for tests of the CUDA path without a GPU."""

from __future__ import annotations

import contextlib
import ctypes
import types
from typing import Any, Iterator, Optional

import numpy as np

from ringreduce._arrays.kinds import ArrayKind, register_kind, unregister_kind

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


class FakeKind(ArrayKind):
    """ringreduce's array operations on FakeCudaArray, done by numpy on the host memory
    behind it, as torch or cupy would do them on a GPU. Counts the arrays it allocates."""

    name = "fake-cuda"

    def __init__(self) -> None:
        self.allocated = 0

    @staticmethod
    def _np(x: Any) -> Any:
        return x.array if isinstance(x, FakeCudaArray) else x

    def _new(self, like: FakeCudaArray, arr: np.ndarray) -> FakeCudaArray:
        self.allocated += 1
        return FakeCudaArray(arr, device=like.device.id)

    def empty(self, like, shape, dtype=None):
        return self._new(like, np.empty(shape, dtype=like.dtype if dtype is None else dtype))

    def zeros(self, like, shape, dtype=None):
        return self._new(like, np.zeros(shape, dtype=like.dtype if dtype is None else dtype))

    def contiguous(self, x):
        return self._new(x, np.ascontiguousarray(x.array))

    def assign(self, dst, src):
        np.copyto(dst.array, self._np(src), casting="unsafe")

    def divide(self, dst, src, divisor):
        np.divide(self._np(src), divisor, out=dst.array, casting="unsafe")

    def add_(self, acc, x):
        np.add(acc.array, self._np(x), out=acc.array)

    def copy(self, x):
        return self._new(x, x.array.copy())

    def view(self, flat, offset, shape):
        n = int(np.prod(shape, dtype=np.int64))
        return FakeCudaArray(flat.array[offset : offset + n].reshape(shape), device=flat.device.id)

    def to_host(self, x):
        return x.array.copy()

    def from_host(self, like, host):
        return self._new(like, np.array(host, copy=True))

    def over_bytes(self, raw, dtype):
        # A device window on the fake device: its memory is host memory.
        mem = np.frombuffer((ctypes.c_uint8 * raw.nbytes).from_address(raw.ptr), np.uint8)
        out = FakeCudaArray(mem.view(dtype), device=raw.device.id)
        out.owner = raw  # the window lives as long as the bucket
        return out


@contextlib.contextmanager
def fake_kind() -> Iterator[FakeKind]:
    """Registers a FakeKind with ringreduce for the duration of the block."""
    kind = FakeKind()
    register_kind(lambda x: isinstance(x, FakeCudaArray), kind)
    try:
        yield kind
    finally:
        unregister_kind(kind)
