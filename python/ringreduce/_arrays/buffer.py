"""One descriptor for every array a collective is given.

The engine works on raw pointers. `describe` turns whatever the caller passed
(numpy arrays, anything with the buffer protocol or DLPack, torch tensors on the
CPU or a GPU, cupy arrays, anything exporting ``__cuda_array_interface__``) into
a `Buffer`: pointer, shape, dtype, device, the caller's stream, and the object
that keeps the memory alive. Every collective is written once over it, and bad
input fails here with a ValueError/TypeError naming the argument, before any
rank talks to another.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

import numpy as np

from .. import _core
from .bfloat16 import bfloat16

__all__ = [
    "Buffer",
    "DTYPES",
    "FLOATING",
    "SUPPORTED_DTYPES",
    "as_array",
    "describe",
    "dtype_code",
    "is_torch_tensor",
]

# The engine's dtypes, by numpy/torch name, as the extension numbers them.
DTYPES: Dict[str, Any] = dict(_core.DType.__members__)
SUPPORTED_DTYPES = tuple(DTYPES)
FLOATING = frozenset({"float16", "bfloat16", "float32", "float64"})

_DLPACK_CUDA = 2  # kDLCUDA in DLPack's DLDeviceType
HOST = -1
"""`Buffer.device` of host memory."""


@dataclass(frozen=True)
class Buffer:
    """One array as the engine sees it."""

    obj: Any  # what the memory belongs to: the caller's object, or a copy standing in for it
    ptr: int
    shape: Tuple[int, ...]
    dtype: str  # the engine's name for it: "float32", "bfloat16", ...
    itemsize: int
    device: int  # HOST, or the CUDA device that owns the memory
    stream: int  # device arrays: the caller's cudaStream_t (0: legacy default stream)
    contiguous: bool
    readonly: bool
    host: Optional[np.ndarray] = None  # host arrays: a numpy view of the memory

    @property
    def size(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Size in bytes."""
        return self.size * self.itemsize

    @property
    def where(self) -> str:
        """'host memory' or 'cuda:N', for error messages."""
        return "host memory" if self.device == HOST else f"cuda:{self.device}"


def is_torch_tensor(x: Any) -> bool:
    """True for torch.Tensor, without importing torch."""
    return type(x).__module__.startswith("torch") and hasattr(x, "data_ptr")


def dtype_code(name: str, what: str = "x") -> Any:
    """The engine's code for a dtype name; TypeError for anything unsupported."""
    if name not in DTYPES:
        raise TypeError(
            f"{what}: unsupported dtype {name}; supported: {', '.join(SUPPORTED_DTYPES)} "
            "(bfloat16 from ml_dtypes or torch)"
        )
    return DTYPES[name]


def describe(x: Any, what: str = "x") -> Buffer:
    """The Buffer of any supported array; TypeError for anything else."""
    if isinstance(x, np.ndarray):
        if isinstance(x, np.ma.MaskedArray):  # the mask would be ignored, not applied
            raise TypeError(
                f"{what}: masked arrays are not supported (masked elements would be reduced "
                "as their hidden values); pass x.filled(value) or np.asarray(x)"
            )
        return _from_numpy(x, x)
    if is_torch_tensor(x):
        return _from_torch(x, what)
    cai = _cuda_array_interface(x)
    if cai is not None:
        return _from_cai(x, cai)
    if _dlpack_device(x) == _DLPACK_CUDA:
        return describe(_import_cuda_dlpack(x, what), what)
    if hasattr(x, "__dlpack__"):
        try:
            return _from_numpy(np.from_dlpack(x), x)
        except (TypeError, BufferError, RuntimeError, ValueError) as exc:
            # numpy's DLPack import refuses dtypes numpy lacks (bfloat16: a JAX bf16
            # array); the object's own __array__ hands them over as ml_dtypes arrays.
            host = _via_array(x)
            if host is not None:
                return _from_numpy(host, x)
            raise TypeError(
                f"{what}: cannot import {type(x).__name__} through DLPack: {exc}"
            ) from exc
    try:
        return _from_numpy(np.asarray(memoryview(x)), x)
    except TypeError:
        raise TypeError(
            f"{what}: expected a numpy array, a torch tensor, a CUDA array, or an object "
            f"exporting DLPack or the buffer protocol; got {type(x).__name__}"
        ) from None


def _via_array(x: Any) -> Optional[np.ndarray]:
    """``np.asarray(x)`` for an object with ``__array__`` whose dtype ringreduce reduces
    (bfloat16, float16 and the rest), else None."""
    if not hasattr(x, "__array__"):
        return None
    try:
        host = np.asarray(x)
    except (TypeError, ValueError, RuntimeError):
        return None
    return host if host.dtype.name in DTYPES else None


def as_array(x: Any, what: str = "x") -> np.ndarray:
    """A numpy view of a host array, sharing its memory (no copy)."""
    buf = describe(x, what)
    if buf.host is None:
        raise TypeError(f"{what}: expected an array in host memory, got one on {buf.where}")
    return buf.host


# ---- host memory -------------------------------------------------------------


# numpy computes dtype.name anew on every access (microseconds, per call):
# remember it per dtype instead.
_dtype_names: Dict[np.dtype, str] = {}


def _dtype_name(dtype: np.dtype) -> str:
    name = _dtype_names.get(dtype)
    if name is None:
        name = dtype.name
        if not dtype.isnative:  # never reduced as if native: that gives wrong numbers
            name = f"{dtype.str} (non-native byte order: convert with .astype('{dtype.name}'))"
        _dtype_names[dtype] = name
    return name


def _from_numpy(arr: np.ndarray, owner: Any) -> Buffer:
    flags = arr.flags
    return Buffer(
        obj=owner,
        ptr=arr.ctypes.data,
        shape=arr.shape,
        dtype=_dtype_name(arr.dtype),
        itemsize=arr.itemsize,
        device=HOST,
        stream=0,
        contiguous=flags.c_contiguous,
        readonly=not flags.writeable,
        host=arr,
    )


def _torch_strided() -> Any:
    import torch

    return torch.strided


def _torch_numpy_view(t: Any) -> np.ndarray:
    import torch

    t = t.detach()
    if t.dtype == torch.bfloat16:
        # numpy has no bfloat16; reinterpret the bits as ml_dtypes.bfloat16.
        return t.view(torch.int16).numpy().view(bfloat16("a torch.bfloat16 tensor"))
    return t.numpy()


def _from_torch(t: Any, what: str) -> Buffer:
    if t.layout != _torch_strided():
        raise TypeError(
            f"{what}: {t.layout} tensors are not supported; pass a dense one (.to_dense())"
        )
    if t.is_neg() or t.is_conj():
        # A lazily negated (or conjugated) view: its memory holds the values before the
        # negation. Read a resolved copy; nothing can be written into the view.
        resolved = t.resolve_neg().resolve_conj()
        return dataclasses.replace(_from_torch(resolved, what), readonly=True)
    if t.device.type == "cpu":
        try:
            view = _torch_numpy_view(t)
        except TypeError:  # float8, quantized and other types numpy has no dtype for
            raise TypeError(
                f"{what}: unsupported dtype {str(t.dtype).replace('torch.', '')}; supported: "
                f"{', '.join(SUPPORTED_DTYPES)}"
            ) from None
        return _from_numpy(view, t)
    if t.device.type != "cuda":
        raise TypeError(f"{what}: tensors on {t.device} are not supported; use CPU or CUDA")
    import torch

    device = t.device.index if t.device.index is not None else torch.cuda.current_device()
    return Buffer(
        obj=t,
        ptr=int(t.data_ptr()),
        shape=tuple(int(n) for n in t.shape),
        dtype=str(t.dtype).replace("torch.", ""),
        itemsize=int(t.element_size()),
        device=int(device),
        stream=int(torch.cuda.current_stream(device).cuda_stream),
        contiguous=bool(t.is_contiguous()),
        readonly=False,
    )


# ---- CUDA memory -------------------------------------------------------------


def _cuda_array_interface(x: Any) -> Optional[dict]:
    if isinstance(x, np.ndarray):
        return None
    try:
        return getattr(x, "__cuda_array_interface__", None)
    except Exception:  # a property that refuses (e.g. an array on another device type)
        return None


def _dlpack_device(x: Any) -> Optional[int]:
    device = getattr(x, "__dlpack_device__", None)
    if device is None:
        return None
    try:
        return int(device()[0])
    except Exception:
        return None


def _is_cupy(x: Any) -> bool:
    return type(x).__module__.startswith("cupy")


def _from_cai(x: Any, cai: dict) -> Buffer:
    shape = tuple(int(n) for n in cai["shape"])
    ptr, readonly = cai["data"]
    try:  # cupy, numba and friends carry a numpy dtype, bfloat16 included
        dtype = np.dtype(x.dtype)
    except (AttributeError, TypeError):
        dtype = np.dtype(cai["typestr"])
    owner = getattr(getattr(x, "device", None), "id", None)  # cupy's Device
    if isinstance(owner, int):
        device = owner
    else:
        device = int(_core.cuda_pointer_device(int(ptr))) if ptr else 0
    if _is_cupy(x):
        import cupy

        with cupy.cuda.Device(device):
            stream = int(cupy.cuda.get_current_stream().ptr)
    else:
        # The interface's codes (None: no sync needed, 1 legacy default, 2 per-thread
        # default, else a cudaStream_t) are the runtime's own stream handles.
        stream = int(cai.get("stream") or 0)
    return Buffer(
        obj=x,
        ptr=int(ptr),
        shape=shape,
        dtype=dtype.name,
        itemsize=dtype.itemsize,
        device=device,
        stream=stream,
        contiguous=_c_contiguous(shape, cai.get("strides"), dtype.itemsize),
        readonly=bool(readonly),
    )


def _c_contiguous(shape: Tuple[int, ...], strides: Any, itemsize: int) -> bool:
    # The interface leaves strides out for C-contiguous arrays; as in numpy, the
    # strides of dimensions of length 1 do not matter.
    if strides is None or math.prod(shape) == 0:
        return True
    expected = itemsize
    for n, stride in reversed(list(zip(shape, strides))):
        if n != 1 and stride != expected:
            return False
        expected *= n
    return True


def _import_cuda_dlpack(x: Any, what: str) -> Any:
    # Either library asks the producer to order its work before the importer's
    # current stream, which is then the caller's stream.
    try:
        import torch

        return torch.from_dlpack(x)
    except ImportError:
        pass
    try:
        import cupy

        return cupy.from_dlpack(x)
    except ImportError:
        raise TypeError(
            f"{what}: {type(x).__name__} is on a CUDA device and exports only DLPack; "
            "ringreduce imports such arrays through torch or cupy, and neither is installed"
        ) from None
