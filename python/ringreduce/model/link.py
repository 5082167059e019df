"""The model's vocabulary: collectives, algorithms, dtypes, the engine's defaults, and a
link's latency and bandwidth."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from .. import _core

COLLECTIVES = (
    "all_reduce",
    "reduce_scatter",
    "all_gather",
    "broadcast",
    "reduce",
    "gather",
    "scatter",
    "all_to_all",
    "barrier",
)
ALGORITHMS = ("ring", "small", "direct", "hierarchical")  # of all_reduce

_ITEMSIZE = {
    "float16": 2,
    "bfloat16": 2,
    "float32": 4,
    "float64": 8,
    "int8": 1,
    "uint8": 1,
    "int32": 4,
    "int64": 8,
}

# The engine's defaults, read from csrc/engine/options.h through a default-made Options:
# the message size of every step, and the all_reduce size at 2 ranks up to which the
# latency paths run (scaled by 2/N).
DEFAULT_SEGMENT_BYTES: int = _core.Options().segment_bytes
DEFAULT_SMALL_BYTES: int = _core.Options().small_bytes
# reduce_scatter moves each chunk in pieces of this many segments (collective.cc).
_PIECE_SEGMENTS = 4


def itemsize(dtype: str) -> int:
    """Bytes per element of a dtype name ringreduce supports ("float16", "bfloat16", ...)."""
    try:
        return _ITEMSIZE[str(dtype)]
    except KeyError:
        raise ValueError(f"dtype: one of {', '.join(_ITEMSIZE)}, got {dtype!r}") from None


@dataclass(frozen=True)
class Link:
    """One kind of link: ``alpha`` seconds per dependent step, ``beta`` seconds per byte
    per direction (1 / bandwidth)."""

    alpha: float
    beta: float

    @classmethod
    def from_gbps(cls, gbit_per_s: float, alpha: float = 10e-6) -> Link:
        """A link of ``gbit_per_s`` Gbit/s per direction (800 -> 100 GB/s)."""
        return cls(alpha, 8.0 / (gbit_per_s * 1e9))

    @classmethod
    def from_gbs(cls, gbyte_per_s: float, alpha: float = 10e-6) -> Link:
        """A link of ``gbyte_per_s`` GB/s (1e9 bytes) per direction."""
        return cls(alpha, 1.0 / (gbyte_per_s * 1e9))

    @property
    def gbs(self) -> float:
        """Bandwidth in GB/s (1e9 bytes per second); inf for a free link."""
        return math.inf if self.beta <= 0 else 1e-9 / self.beta


# Assumed when nothing is given or probed: shared memory of a recent server with several
# ranks copying at once, and a 10 Gbit/s Ethernet link. Printed as "assumed".
DEFAULT_LINKS: Mapping[str, Link] = {
    "shm": Link.from_gbs(5.0, alpha=3e-6),
    "tcp": Link.from_gbps(10.0, alpha=25e-6),
    "mpi": Link.from_gbps(10.0, alpha=10e-6),
}
