"""One bucket: a flat wire buffer and the step state of the parameters packed into it."""

from __future__ import annotations

from typing import Any

from .._arrays.buffer import describe

__all__ = ["_Bucket"]


class _Bucket:
    """One flat wire buffer and the step state of the parameters packed into it."""

    def __init__(
        self,
        index: int,
        params: list[int],
        offsets: list[int],
        buffer: Any,
        average: int,
        elements: int,
        dtype: Any,
    ):
        self.index = index
        self.params = params
        self.offsets = offsets
        self.buffer = buffer
        self.elements = elements  # the buffer's length and (numpy) dtype, to allocate it again
        self.dtype = dtype
        self.nbytes = describe(buffer).nbytes
        # Averaging over `average` ranks: 32/64-bit floats are summed, then divided once
        # (all_reduce op "avg"); 16-bit ones are divided while they are copied in, before
        # the sum, as PyTorch DDP does, which keeps their sums in range.
        wide = describe(buffer).itemsize >= 4
        self.op = "avg" if average > 1 and wide else "sum"
        self.divisor = average if average > 1 and not wide else 1
        # Fault-tolerant: the last step's reduced result, until the next step ends (for
        # survivors a death left one step behind: `recovery.replay`). Not reset.
        self.kept: Any = None
        self.reset()

    def reset(self) -> None:
        """Forgets the last step: nothing ready, nothing in flight."""
        self.pending = len(self.params)
        self.work: Any = None
        self.first_ready: float | None = None
        self.last_ready: float | None = None
        self.launch: float | None = None
        self.done: float | None = None
        self.local: Any = None  # fault-tolerant: the local contribution, as launched
        self.local_divisor = self.divisor
