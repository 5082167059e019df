"""CUDA arrays in the collectives.

An argument is a CUDA array when it is a torch tensor on a CUDA device, exports
``__cuda_array_interface__`` (cupy, numba, ...), or exports DLPack with a CUDA
device (imported through torch or cupy, whichever is installed). The engine gets
its device pointer, its device and the caller's stream, moves the data through
pinned host memory segment by segment, and reduces on the device
(csrc/algorithms/staged_pipeline.h).

Stream semantics:

- The caller's stream is ``torch.cuda.current_stream(device)`` for torch tensors,
  ``cupy.cuda.get_current_stream()`` for cupy arrays, and the ``stream`` entry of
  ``__cuda_array_interface__`` for other arrays (the legacy default stream when
  it has none). For ``out``, the stream of ``x`` is the one that counts.
- The collective touches x and out only after the work queued on that stream
  before the call: it records an event there, on the calling thread, during the
  call. Work queued later, or on other streams, is not waited for: make the
  caller's stream wait for other producers first.
- The result is ready when the call returns, or when ``Work.wait()`` returns for
  ``async_op=True``: the GPU has then finished writing it, so the host and every
  stream may use it without more synchronization. Until then no stream may write
  x or out, or read out.
- The collectives run on streams of their own and never make the caller's stream
  wait, so compute queued after an ``async_op=True`` call overlaps with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional, Tuple

import numpy as np

from . import _core
from ._buffers import dtype_code_of, is_torch_tensor

__all__ = ["DeviceArray", "is_device_array", "involves_device", "describe"]

_DLPACK_CUDA = 2  # kDLCUDA


@dataclass(frozen=True)
class DeviceArray:
    """What the engine needs to know about one CUDA array."""

    obj: Any  # the array itself, kept alive while the engine uses it
    ptr: int
    device: int
    shape: Tuple[int, ...]
    dtype: str  # "float32", "bfloat16", ...
    itemsize: int
    contiguous: bool
    readonly: bool
    stream: int  # a cudaStream_t: 0 legacy default, 1 legacy, 2 per-thread default

    @property
    def size(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Size in bytes."""
        return self.size * self.itemsize


def _is_cupy(x: Any) -> bool:
    return type(x).__module__.split(".")[0] == "cupy"


def _cuda_array_interface(x: Any) -> Optional[dict]:
    try:
        return getattr(x, "__cuda_array_interface__", None)
    except Exception:  # a property that refuses (e.g. an array on another device type)
        return None


def is_device_array(x: Any) -> bool:
    """True when x lives in CUDA device memory."""
    if x is None or isinstance(x, np.ndarray):
        return False
    if is_torch_tensor(x):
        return bool(x.is_cuda)
    if _cuda_array_interface(x) is not None:
        return True
    dlpack_device = getattr(x, "__dlpack_device__", None)
    if dlpack_device is None:
        return False
    try:
        return int(dlpack_device()[0]) == _DLPACK_CUDA
    except Exception:
        return False


def involves_device(*arrays: Any) -> bool:
    """True when any of the arrays is a CUDA array: the call takes the device path."""
    for a in arrays:
        if a is not None and not isinstance(a, np.ndarray) and is_device_array(a):
            return True
    return False


def describe(x: Any, what: str = "x") -> DeviceArray:
    """Pointer, device, layout and caller's stream of a CUDA array."""
    if is_torch_tensor(x):
        return _describe_torch(x)
    cai = _cuda_array_interface(x)
    if cai is not None:
        return _describe_cai(x, cai)
    return _describe_torch(_import_dlpack(x, what))


def _describe_torch(t: Any) -> DeviceArray:
    import torch

    device = t.device.index if t.device.index is not None else torch.cuda.current_device()
    return DeviceArray(
        obj=t,
        ptr=int(t.data_ptr()),
        device=int(device),
        shape=tuple(int(n) for n in t.shape),
        dtype=str(t.dtype).replace("torch.", ""),
        itemsize=int(t.element_size()),
        contiguous=bool(t.is_contiguous()),
        readonly=False,
        stream=int(torch.cuda.current_stream(device).cuda_stream),
    )


def _describe_cai(x: Any, cai: dict) -> DeviceArray:
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
    return DeviceArray(
        obj=x,
        ptr=int(ptr),
        device=device,
        shape=shape,
        dtype=dtype.name,
        itemsize=dtype.itemsize,
        contiguous=_c_contiguous(shape, cai.get("strides"), dtype.itemsize),
        readonly=bool(readonly),
        stream=stream,
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


def _import_dlpack(x: Any, what: str) -> Any:
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


# ---- arguments ---------------------------------------------------------------


def _input(x: Any, what: str, other: str) -> DeviceArray:
    if not is_device_array(x):
        raise ValueError(
            f"{what} is in host memory but {other} is on a CUDA device; pass both on the same "
            "device, or both on the host"
        )
    arr = describe(x, what)
    dtype_code_of(arr.dtype, what)
    if not arr.contiguous:
        arr = describe(_contiguous_copy(arr, what), what)
    return arr


def _contiguous_copy(arr: DeviceArray, what: str) -> Any:
    if is_torch_tensor(arr.obj):
        return arr.obj.detach().contiguous()
    if _is_cupy(arr.obj):
        import cupy

        with cupy.cuda.Device(arr.device):
            return cupy.ascontiguousarray(arr.obj)
    raise ValueError(
        f"{what}: the CUDA array is not C-contiguous; pass a contiguous one (ringreduce makes "
        "contiguous copies of torch tensors and cupy arrays only)"
    )


def _output(out: Any, like: DeviceArray, shape: Tuple[int, ...]) -> DeviceArray:
    if not is_device_array(out):
        raise ValueError(
            f"out is in host memory but x is on cuda:{like.device}; pass both on the same "
            "device, or both on the host"
        )
    arr = describe(out, "out")
    if arr.dtype != like.dtype:
        raise TypeError(f"out: dtype {arr.dtype} does not match the input's {like.dtype}")
    if arr.shape != tuple(shape):
        raise ValueError(f"out: shape {arr.shape} does not match the expected {tuple(shape)}")
    if arr.device != like.device:
        raise ValueError(f"out is on cuda:{arr.device} but x is on cuda:{like.device}")
    if arr.readonly:
        raise ValueError("out: the array is read-only")
    if not arr.contiguous:
        raise ValueError("out: the array must be C-contiguous (results are written in place)")
    return arr


def _allocate(like: DeviceArray, shape: Tuple[int, ...]) -> Any:
    obj = like.obj
    if is_torch_tensor(obj):
        import torch

        return torch.empty(shape, dtype=obj.dtype, device=obj.device)
    if _is_cupy(obj):
        import cupy

        with cupy.cuda.Device(like.device):
            return cupy.empty(shape, dtype=obj.dtype)
    raise TypeError(
        f"out: ringreduce allocates CUDA results for torch tensors and cupy arrays only; "
        f"pass out= for {type(obj).__name__}"
    )


def _check_no_partial_overlap(a: DeviceArray, b: DeviceArray) -> None:
    if a.ptr != b.ptr and a.ptr < b.ptr + b.nbytes and b.ptr < a.ptr + a.nbytes:
        raise ValueError(
            "out overlaps x without being x; pass out=x for in-place, or separate arrays"
        )


def _submit(
    comm: Any,
    kind: int,
    src: DeviceArray,
    dst: DeviceArray,
    op: int,
    root: int,
    result: Any,
    keep: tuple,
    async_op: bool,
    finalize: Optional[Callable[[], None]] = None,
) -> Any:
    return comm._submit(
        kind, src, dst, src.size, dtype_code_of(src.dtype), op, root, result, keep, async_op,
        finalize, device=src.device, stream=src.stream,
    )  # fmt: skip


# ---- the collectives on CUDA arrays (called by Communicator) -----------------


def all_reduce(comm: Any, x: Any, op: Any, out: Any, async_op: bool) -> Any:
    """Communicator.all_reduce for CUDA arrays."""
    from .communicator import _ALL_REDUCE, _op_code

    src = _input(x, "x", "out")
    opc = _op_code(op, src.dtype)
    if out is None:
        result = _allocate(src, src.shape)
        dst = describe(result, "out")
    else:
        dst = _output(out, src, src.shape)
        _check_no_partial_overlap(src, dst)
        result = out
    return _submit(comm, _ALL_REDUCE, src, dst, opc, 0, result, (x, out), async_op)


def reduce_scatter(comm: Any, x: Any, op: Any, out: Any, async_op: bool) -> Any:
    """Communicator.reduce_scatter for CUDA arrays."""
    from .communicator import _REDUCE_SCATTER, _op_code, chunk_bounds

    src = _input(x, "x", "out")
    opc = _op_code(op, src.dtype)
    start, stop = chunk_bounds(src.size, comm.world_size, comm.rank)
    if out is None:
        result = _allocate(src, (stop - start,))
        dst = describe(result, "out")
    else:
        dst = _output(out, src, (stop - start,))
        result = out
    return _submit(comm, _REDUCE_SCATTER, src, dst, opc, 0, result, (x, out), async_op)


def all_gather(comm: Any, x: Any, out: Any, async_op: bool) -> Any:
    """Communicator.all_gather for CUDA arrays."""
    from .communicator import _ALL_GATHER

    src = _input(x, "x", "out")
    shape = (comm.world_size,) + src.shape
    if out is None:
        result = _allocate(src, shape)
        dst = describe(result, "out")
    else:
        dst = _output(out, src, shape)
        result = out
    return _submit(comm, _ALL_GATHER, src, dst, 0, 0, result, (x, out), async_op)


def broadcast(comm: Any, x: Any, root: int, async_op: bool) -> Any:
    """Communicator.broadcast for CUDA arrays (root already checked)."""
    from .communicator import _BROADCAST

    arr = describe(x, "x")
    dtype_code_of(arr.dtype, "x")
    if comm.rank != root and arr.readonly:
        raise ValueError("x: the array is read-only, but broadcast writes into it")
    finalize = None
    buf = arr
    if not arr.contiguous:
        # Broadcast into a contiguous copy, then write it back on the caller's stream.
        copy = _contiguous_copy(arr, "x")
        buf = describe(copy, "x")

        def finalize() -> None:
            if comm.rank != root:
                _write_back(x, copy)

    return _submit(comm, _BROADCAST, buf, buf, 0, int(root), x, (x,), async_op, finalize)


def _write_back(x: Any, copy: Any) -> None:
    if is_torch_tensor(x):
        x.detach().copy_(copy)
    else:
        x[...] = copy
