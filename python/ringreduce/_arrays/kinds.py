"""What ringreduce does with arrays besides reading their pointers: allocate a result like
the input, make a contiguous copy, write one array into another, and the few element-wise
operations gradient buckets need. One `ArrayKind` per array library, chosen by the type of
the array; the same kinds serve the collectives and `GradientBucketer`, on the host and on
the GPU alike.

Kinds exist for numpy (host memory, and anything else `describe` reads as host memory),
torch (CPU and CUDA tensors) and cupy. `register_kind` adds one for another library; an
array of a library without a kind can still be reduced, but only into an ``out=`` the
caller provides.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Tuple

import numpy as np

from .buffer import Buffer, is_torch_tensor

__all__ = ["ArrayKind", "array_for", "kind_of", "register_kind", "unregister_kind"]


class ArrayKind:
    """The operations on one library's arrays. Element-wise operations run where the
    arrays live (on the GPU for CUDA arrays, on the caller's current stream)."""

    name = "?"

    def empty(self, like: Any, shape: Tuple[int, ...], dtype: Any = None) -> Any:
        """A new array on like's device, of like's dtype (or ``dtype``, a numpy dtype)."""
        raise NotImplementedError

    def zeros(self, like: Any, shape: Tuple[int, ...], dtype: Any = None) -> Any:
        """As `empty`, filled with zeros."""
        raise NotImplementedError

    def contiguous(self, x: Any) -> Any:
        """A C-contiguous copy of x (or x itself when it is one)."""
        raise NotImplementedError

    def assign(self, dst: Any, src: Any) -> None:
        """dst[...] = src (an array or a number), casting to dst's dtype."""
        raise NotImplementedError

    def divide(self, dst: Any, src: Any, divisor: int) -> None:
        """dst[...] = src / divisor, computed in src's dtype and rounded once into dst's."""
        raise NotImplementedError

    def add_(self, acc: Any, x: Any) -> None:
        """acc += x."""
        raise NotImplementedError

    def scale(self, x: Any, factor: float) -> None:
        """x *= factor, in place (x's dtype)."""
        x *= factor

    def copy(self, x: Any) -> Any:
        """A new array equal to x."""
        raise NotImplementedError

    def view(self, flat: Any, offset: int, shape: Tuple[int, ...]) -> Any:
        """The elements [offset, offset + prod(shape)) of a 1-D array, shaped."""
        raise NotImplementedError

    def to_host(self, x: Any) -> np.ndarray:
        """A numpy copy of x (state that outlives a step, such as residuals, is saved
        from device arrays this way)."""
        raise NotImplementedError

    def from_host(self, like: Any, host: np.ndarray) -> Any:
        """A new array on like's device holding a copy of ``host`` (its dtype)."""
        raise NotImplementedError

    def over_bytes(self, raw: Any, dtype: np.dtype) -> Any:
        """An array of this library over the bytes ``raw`` (no copy), read as ``dtype``:
        buckets in memory the engine handed out (a window). ``raw`` is a numpy array of
        host bytes, or a device window's bytes (``__cuda_array_interface__``, its
        ``device.id``); TypeError where this library cannot hold that memory."""
        raise TypeError(f"{self.name} arrays cannot be made over {type(raw).__name__}")


class NumpyKind(ArrayKind):
    """numpy arrays, and any host memory read through the buffer protocol or DLPack."""

    name = "numpy"

    def empty(self, like, shape, dtype=None):
        return np.empty(shape, dtype=like.dtype if dtype is None else dtype)

    def zeros(self, like, shape, dtype=None):
        return np.zeros(shape, dtype=like.dtype if dtype is None else dtype)

    def contiguous(self, x):
        return np.ascontiguousarray(x)

    def assign(self, dst, src):
        np.copyto(dst, src, casting="unsafe")

    def divide(self, dst, src, divisor):
        # unsafe: dst may be narrower (bfloat16 on the wire); the quotient is computed
        # in src's dtype and rounded once into dst.
        np.divide(src, divisor, out=dst, casting="unsafe")

    def add_(self, acc, x):
        np.add(acc, x, out=acc)

    def copy(self, x):
        return np.array(x, copy=True)

    def view(self, flat, offset, shape):
        return flat[offset : offset + int(np.prod(shape, dtype=np.int64))].reshape(shape)

    def to_host(self, x):
        return np.array(x, copy=True)

    def from_host(self, like, host):
        return np.array(host, copy=True)

    def over_bytes(self, raw, dtype):
        return raw.view(dtype)


class TorchKind(ArrayKind):
    """torch tensors, on the CPU or a GPU."""

    name = "torch"

    @staticmethod
    def _dtype(like: Any, dtype: Any) -> Any:
        if dtype is None:
            return like.dtype
        import torch

        name = np.dtype(dtype).name
        return getattr(torch, name)

    def empty(self, like, shape, dtype=None):
        import torch

        return torch.empty(shape, dtype=self._dtype(like, dtype), device=like.device)

    def zeros(self, like, shape, dtype=None):
        import torch

        return torch.zeros(shape, dtype=self._dtype(like, dtype), device=like.device)

    def contiguous(self, x):
        return x.detach().contiguous()

    def assign(self, dst, src):
        if isinstance(src, (int, float)):
            dst.detach().fill_(src)
        else:
            dst.detach().copy_(src)

    def divide(self, dst, src, divisor):
        if dst.dtype == src.dtype:
            import torch

            torch.div(src, divisor, out=dst)
        else:
            dst.copy_(src / divisor)

    def add_(self, acc, x):
        acc.add_(x)

    def copy(self, x):
        return x.detach().clone()

    def view(self, flat, offset, shape):
        n = int(np.prod(shape, dtype=np.int64))
        return flat[offset : offset + n].view(shape)

    def to_host(self, x):
        return x.detach().cpu().numpy().copy()

    def from_host(self, like, host):
        import torch

        return torch.from_numpy(np.array(host, copy=True)).to(like.device)

    def over_bytes(self, raw, dtype):
        import torch

        # Through the bytes: numpy's bfloat16 (ml_dtypes) is not torch's.
        if hasattr(raw, "__cuda_array_interface__"):
            # A device window: the tensor holds `raw`, and so the window, alive.
            flat = torch.as_tensor(raw, device=torch.device("cuda", raw.device.id))
        else:
            flat = torch.from_numpy(raw)
        return flat.view(self._dtype(None, dtype))


class CupyKind(NumpyKind):
    """cupy arrays: numpy's operations, on the array's device."""

    name = "cupy"

    def empty(self, like, shape, dtype=None):
        import cupy

        with cupy.cuda.Device(like.device.id):
            return cupy.empty(shape, dtype=like.dtype if dtype is None else dtype)

    def zeros(self, like, shape, dtype=None):
        import cupy

        with cupy.cuda.Device(like.device.id):
            return cupy.zeros(shape, dtype=like.dtype if dtype is None else dtype)

    def contiguous(self, x):
        import cupy

        with cupy.cuda.Device(x.device.id):
            return cupy.ascontiguousarray(x)

    def assign(self, dst, src):
        dst[...] = src

    def divide(self, dst, src, divisor):
        import cupy

        cupy.divide(src, divisor, out=dst, casting="unsafe")

    def add_(self, acc, x):
        acc += x

    def copy(self, x):
        return x.copy()

    def to_host(self, x):
        import cupy

        return cupy.asnumpy(x)

    def from_host(self, like, host):
        import cupy

        with cupy.cuda.Device(like.device.id):
            return cupy.array(host)

    def over_bytes(self, raw, dtype):
        if not hasattr(raw, "__cuda_array_interface__"):
            raise TypeError("cupy arrays do not live in host memory")
        import cupy

        with cupy.cuda.Device(raw.device.id):
            return cupy.asarray(raw).view(np.dtype(dtype))  # holds `raw` alive


_NUMPY = NumpyKind()
_TORCH = TorchKind()
_CUPY = CupyKind()
# Kinds registered for other libraries, tried first: (predicate, kind).
_registered: List[Tuple[Callable[[Any], bool], ArrayKind]] = []


def register_kind(predicate: Callable[[Any], bool], kind: ArrayKind) -> None:
    """Makes ringreduce use ``kind`` for arrays where ``predicate(array)`` is true."""
    _registered.insert(0, (predicate, kind))


def unregister_kind(kind: ArrayKind) -> None:
    """Undoes `register_kind` for ``kind``."""
    _registered[:] = [(p, k) for p, k in _registered if k is not kind]


def kind_of(x: Any) -> Optional[ArrayKind]:
    """The kind of array x is, or None for a library ringreduce has no kind for."""
    for predicate, kind in _registered:
        if predicate(x):
            return kind
    if isinstance(x, np.ndarray):
        return _NUMPY
    if is_torch_tensor(x):
        return _TORCH
    if type(x).__module__.startswith("cupy"):
        return _CUPY
    return None


def array_for(buf: Buffer, what: str) -> Tuple[ArrayKind, Any]:
    """The kind that handles buf's memory, and the array that kind operates on: the
    caller's own object where its library has a kind (torch in, torch out), else the numpy
    view of host memory. TypeError for CUDA memory of a library without a kind."""
    kind = kind_of(buf.obj)
    if kind is not None:
        return kind, buf.obj
    if buf.host is not None:
        return _NUMPY, buf.host
    raise TypeError(
        f"{what}: ringreduce allocates and copies CUDA arrays of torch and cupy only; "
        f"pass out= (C-contiguous) for {type(buf.obj).__name__}"
    )
