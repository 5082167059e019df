"""Tensor helpers of the torch backend: which dtypes and ops the engine takes, and how
tensors of other dtypes, layouts and shapes are brought to it and back."""

from __future__ import annotations

from typing import Any, List

import torch
import torch.distributed as dist

_R = dist.ReduceOp
_OPS = {
    _R.SUM: "sum",
    _R.PRODUCT: "prod",
    _R.MIN: "min",
    _R.MAX: "max",
    _R.AVG: "avg",
}
# What the engine reduces and moves as it is; other dtypes move as bytes.
_ENGINE_DTYPES = {
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.int8,
    torch.uint8,
    torch.int32,
    torch.int64,
}
# Reduced in a wider type and narrowed back (sums wrap the same way modulo 2^16).
_WIDENED = {torch.int16: torch.int32, torch.bool: torch.uint8}


def _op_name(op: Any, dtype: torch.dtype) -> str:
    for known, name in _OPS.items():
        if op == known:
            if name == "avg" and not dtype.is_floating_point:
                raise ValueError(f"ringreduce: ReduceOp.AVG needs a floating dtype, not {dtype}")
            return name
    raise ValueError(
        f"ringreduce does not support {op} (SUM, PRODUCT, MIN, MAX and AVG are supported; "
        "PREMUL_SUM is NCCL's, and BAND/BOR/BXOR are not implemented)"
    )


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's memory as uint8, for moving data of any dtype."""
    if t.dtype in _ENGINE_DTYPES:
        return t
    return t.reshape(-1).view(torch.uint8) if t.numel() else t.reshape(-1).to(torch.uint8)


def _contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_contiguous() else t.contiguous()


def _one(tensors: Any, what: str) -> list:
    if len(tensors) != 1:
        raise ValueError(
            f"{what}: ringreduce takes one tensor per call (one device per process), "
            f"got {len(tensors)}"
        )
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.layout != torch.strided:
            raise ValueError(f"{what}: ringreduce takes dense tensors, not {t.layout}")
    return list(tensors)


def _check_list(tensors: List[torch.Tensor], n: int, like: torch.Tensor, what: str) -> None:
    if len(tensors) != n:
        raise ValueError(
            f"{what}: a list of {n} tensors (one per rank) expected, got {len(tensors)}"
        )
    for t in tensors:
        if t.numel() != like.numel() or t.dtype != like.dtype:
            raise ValueError(
                f"{what}: every tensor of the list must have {like.numel()} elements of "
                f"{like.dtype}, got {t.numel()} of {t.dtype}"
            )


def _view_as(block: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A staging block (possibly bytes) read as ``like``'s dtype and shape."""
    if block.dtype != like.dtype:
        block = block.reshape(-1).view(like.dtype) if like.numel() else block.to(like.dtype)
    return block.reshape(like.shape)


def _reducible(t: torch.Tensor):
    """(what the engine reduces, what copies it back into t afterwards, or None)."""
    if t.dtype in _ENGINE_DTYPES and t.is_contiguous():
        return t, None
    if t.is_complex():  # sums of (re, im) pairs: torch refuses the other ops for complex
        c = _contiguous(t)
        return torch.view_as_real(c), (None if c is t else lambda: t.copy_(c))
    wide = t.to(_WIDENED.get(t.dtype, t.dtype)).contiguous()
    if wide.dtype not in _ENGINE_DTYPES:
        raise ValueError(f"ringreduce cannot reduce tensors of {t.dtype}")
    return wide, lambda: t.copy_(wide.to(t.dtype))
