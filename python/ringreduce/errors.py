"""The exceptions ringreduce raises.

Every error names the rank that saw it; errors caused by another rank carry
that rank in ``.peer``. Bad local arguments raise ``ValueError``/``TypeError``
before any communication.
"""

from __future__ import annotations

import builtins
from typing import Optional

__all__ = ["RingReduceError", "TimeoutError", "PeerError", "MismatchError"]


class RingReduceError(RuntimeError):
    """Base class of ringreduce's errors. ``peer`` is the rank to blame, if known."""

    peer: Optional[int] = None


class TimeoutError(RingReduceError, builtins.TimeoutError):  # noqa: A001
    """A wait passed its deadline. ``peer`` is the rank that was waited on."""


class PeerError(RingReduceError):
    """A peer died, closed its connection or failed. ``peer`` is its rank."""


class MismatchError(RingReduceError):
    """Ranks called different collectives, or with different count/dtype/op/root."""
