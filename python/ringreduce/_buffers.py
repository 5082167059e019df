"""Turning user arrays (numpy, torch, DLPack, buffer protocol) into numpy views.

The engine works on raw pointers; everything it needs to know about an array
is checked here first, so bad input fails with a ValueError/TypeError naming
the argument before any rank talks to another.
"""

from __future__ import annotations

from typing import Any, Dict

import numpy as np

# Codes shared with csrc/common/dtype.h.
_CODES: Dict[str, int] = {
    "float16": 0,
    "bfloat16": 1,
    "float32": 2,
    "float64": 3,
    "int8": 4,
    "uint8": 5,
    "int32": 6,
    "int64": 7,
}
SUPPORTED_DTYPES = tuple(_CODES)
FLOATING = frozenset({"float16", "bfloat16", "float32", "float64"})


def is_torch_tensor(x: Any) -> bool:
    """True for torch.Tensor, without importing torch."""
    return type(x).__module__.startswith("torch") and hasattr(x, "numpy")


def _torch_to_numpy(t: Any, what: str) -> np.ndarray:
    import torch

    if t.device.type != "cpu":
        raise TypeError(f"{what}: tensors on {t.device} are not supported yet; use a CPU tensor")
    t = t.detach()
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        # numpy has no bfloat16; reinterpret the bits as ml_dtypes.bfloat16.
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def as_array(x: Any, what: str = "x") -> np.ndarray:
    """A numpy view of x sharing its memory (no copy)."""
    if isinstance(x, np.ndarray):
        return x
    if is_torch_tensor(x):
        return _torch_to_numpy(x, what)
    if hasattr(x, "__dlpack__"):
        try:
            return np.from_dlpack(x)
        except (TypeError, BufferError, RuntimeError, ValueError) as exc:
            raise TypeError(
                f"{what}: cannot import {type(x).__name__} through DLPack: {exc}"
            ) from exc
    try:
        return np.asarray(memoryview(x))
    except TypeError:
        raise TypeError(
            f"{what}: expected a numpy array, a torch tensor, or an object exporting DLPack or "
            f"the buffer protocol; got {type(x).__name__}"
        ) from None


def wrap_like(template: Any, arr: np.ndarray) -> Any:
    """Returns arr as the same kind of object as template (torch in, torch out)."""
    if is_torch_tensor(template):
        import torch

        if arr.dtype.name == "bfloat16":
            return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(arr)
    return arr


def dtype_code(arr: np.ndarray, what: str = "x") -> int:
    """The engine's code for arr's dtype; TypeError for anything unsupported."""
    return dtype_code_of(arr.dtype.name, what)


def dtype_code_of(name: str, what: str = "x") -> int:
    """The engine's code for a dtype name ("float32", "bfloat16", ...)."""
    if name not in _CODES:
        raise TypeError(
            f"{what}: unsupported dtype {name}; supported: {', '.join(SUPPORTED_DTYPES)} "
            "(bfloat16 from ml_dtypes or torch)"
        )
    return _CODES[name]


def check_output(out: np.ndarray, *, dtype: np.dtype, shape: tuple, what: str = "out") -> None:
    """out must be writable, C-contiguous, and of the expected dtype and shape."""
    if out.dtype != dtype:
        raise TypeError(f"{what}: dtype {out.dtype.name} does not match the input's {dtype.name}")
    if tuple(out.shape) != tuple(shape):
        raise ValueError(
            f"{what}: shape {tuple(out.shape)} does not match the expected {tuple(shape)}"
        )
    if not out.flags.writeable:
        raise ValueError(f"{what}: the array is read-only")
    if not out.flags.c_contiguous:
        raise ValueError(f"{what}: the array must be C-contiguous (results are written in place)")


def address(arr: Any) -> int:
    """The data pointer of a C-contiguous numpy array (0 for empty arrays is fine), or the
    device pointer of a ``_device.DeviceArray``."""
    if isinstance(arr, np.ndarray):
        return int(arr.__array_interface__["data"][0])
    return int(arr.ptr)
