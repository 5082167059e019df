"""Reduction operators: ``rr.ReduceOp``, strings and torch.distributed.ReduceOp values,
turned into the engine's codes."""

from __future__ import annotations

import enum
from typing import Any

from ... import _core
from ..._arrays.buffer import FLOATING


class ReduceOp(enum.Enum):
    """Reduction operators. Strings ("sum", "avg", ...) are accepted too."""

    SUM = int(_core.Op.SUM)
    PROD = int(_core.Op.PROD)
    MIN = int(_core.Op.MIN)
    MAX = int(_core.Op.MAX)
    AVG = int(_core.Op.AVG)  # floating dtypes only


# torch.distributed.ReduceOp names for ours.
_TORCH_OPS = {"SUM": "SUM", "PRODUCT": "PROD", "MIN": "MIN", "MAX": "MAX", "AVG": "AVG"}


def _op_member(op: Any) -> ReduceOp:
    if isinstance(op, ReduceOp):
        return op
    if isinstance(op, str) and op.upper() in ReduceOp.__members__:
        return ReduceOp[op.upper()]
    # torch.distributed.ReduceOp.SUM and friends, without importing torch.
    name = getattr(op, "name", None)
    if type(op).__module__.startswith("torch") and name in _TORCH_OPS:
        return ReduceOp[_TORCH_OPS[name]]
    raise ValueError(
        f"op: unknown reduction {op!r}; use one of sum, prod, min, max, avg (strings, "
        "rr.ReduceOp or torch.distributed.ReduceOp)"
    )


def op_code(op: Any, dtype_name: str) -> Any:
    member = _op_member(op)
    if member is ReduceOp.AVG and dtype_name not in FLOATING:
        raise ValueError(
            f"op: avg is defined for floating dtypes only, not {dtype_name} "
            "(use sum and divide, choosing your own rounding)"
        )
    return _core.Op(member.value)
