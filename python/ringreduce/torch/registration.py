"""The backend's name in torch.distributed: ``init_process_group("ringreduce")``; and
``dist.shrink_group`` taught to shrink its groups (`shrink.install`)."""

from __future__ import annotations

import datetime
from typing import Any

import torch.distributed as dist

from . import shrink
from .backend import BACKEND, ProcessGroupRingReduce

__all__ = ["register"]


def _create(store: Any, rank: int, size: int, timeout: datetime.timedelta) -> Any:
    return ProcessGroupRingReduce(store, rank, size, timeout)


def register() -> None:
    """Registers backend "ringreduce" with torch.distributed (idempotent)."""
    shrink.install()
    if BACKEND.upper() in getattr(dist.Backend, "_plugins", {}):
        return
    dist.Backend.register_backend(BACKEND, _create, devices=["cpu", "cuda"])
