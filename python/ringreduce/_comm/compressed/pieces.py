"""Whether a compressed call runs in pieces, and how it is cut (`compressed_hop.one_hop`
runs them).

In pieces, a call's codec work overlaps its exchanges: that pays where the exchanges
wait on a slow link, and costs where they keep the CPU busy (a fast link, or shared
memory, where the exchanges are copies the same cores make). So ringreduce measures it:

- Over shared memory on one host, in a world of one, with ``piece_values`` 0 or
  ``pieces="never"``, and for calls whose chunks hold fewer than twice ``piece_values``
  values, calls run whole.
- Otherwise the first such call of each codec and size class (n's power of two) runs
  whole and is timed: its codec time C, and the CPU time the host's processors spent
  idle over it (/proc/stat), shared by the ranks on the host: what pieces could run the
  codec in while the link works. (Where the host does not say, this process's wall time
  less its CPU time stands in.) Every rank then shares min(spare / C) in one small
  all_reduce (exact), and calls of that codec and class run in pieces from then on when
  the rank with the least spare CPU had at least half its codec's time (``THRESHOLD``).
  The same on every rank, since all take the same value.
- ``pieces="always"`` cuts every call that is long enough (benchmarks, tests).
"""

from __future__ import annotations

import os
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ...compression.blocks import BLOCK

__all__ = ["MAX_PIECES", "THRESHOLD", "PieceChoice", "host_idle_seconds", "pieces"]

# A call runs in at most this many pieces (their number is in its seeds, 5 bits).
MAX_PIECES = 16
# Pieces when the spare CPU covers this much of the codec's time: they hide up to the
# spare time, and their own cost (more, smaller exchanges) is small next to half the
# codec's. Measured on 4 emulated hosts (docs/compression.md): 0.89-17 at 1 Gbit/s,
# where pieces paid (for int4 in two runs of three), 0-0.34 at 10 Gbit/s, where they
# did not.
THRESHOLD = 0.5


def pieces(bounds: Sequence[Any], piece_values: int) -> List[List[Any]]:
    """The chunks' bounds cut into pieces, each piece one (lo, hi) per chunk: every chunk
    is cut at the same offsets, multiples of one step of whole ``BLOCK``s (so a piece's
    blocks, and their scales, are the chunk's), at least ``piece_values`` values long
    and long enough for ``MAX_PIECES`` pieces at most (the last may be shorter: every
    piece's rows are the longest piece's size); one piece (the chunks) when the
    longest chunk holds fewer than twice ``piece_values`` or it is 0. Every rank cuts
    alike: the bounds depend on the count and the world size only."""
    longest = max(hi - lo for lo, hi in bounds)
    if piece_values <= 0 or longest < 2 * piece_values:
        return [list(bounds)]
    count = min(MAX_PIECES, longest // piece_values)
    step = -(-longest // count // BLOCK) * BLOCK
    return [
        [(min(hi, lo + j * step), min(hi, lo + (j + 1) * step)) for lo, hi in bounds]
        for j in range(-(-longest // step))
    ]


class PieceChoice:
    """One communicator's choices (see the module's docstring): by (codec name, size
    class), the agreed min(spare / C) once measured; its calls run in pieces from
    ``THRESHOLD``."""

    def __init__(self) -> None:
        self.ratios: Dict[Tuple[str, int], float] = {}

    def plan(
        self, comm: Any, codec: str, n: int, settings: Any
    ) -> Tuple[int, Optional[Tuple[str, int]]]:
        """(the piece_values this call of n values through ``codec`` runs with, 0:
        whole; the (codec, size class) to measure it for, or None)."""
        piece_values = settings.piece_values
        if (
            comm.world_size == 1
            or comm.transport == "shm"
            or piece_values <= 0
            or settings.pieces == "never"
            or -(-n // comm.world_size) < 2 * piece_values
        ):
            return 0, None
        if settings.pieces == "always":
            return piece_values, None
        key = (codec, int(n).bit_length())
        ratio = self.ratios.get(key)
        if ratio is None:
            return 0, key
        return (piece_values if ratio >= THRESHOLD else 0), None

    def measure(self) -> Tuple[float, float, Optional[float]]:
        """The clocks a measured call starts from: (wall, process CPU, the host's idle
        CPU seconds or None where the host does not say)."""
        return time.perf_counter(), time.process_time(), host_idle_seconds()

    def decide(
        self,
        comm: Any,
        key: Tuple[str, int],
        start: Tuple[float, float, Optional[float]],
        codec_seconds: float,
    ) -> bool:
        """Ends a measured call (``start``: `measure` before it; ``codec_seconds``: its
        codec time): the ranks agree on the class's choice, in one small all_reduce."""
        wall = time.perf_counter() - start[0]
        cpu = time.process_time() - start[1]
        idle = host_idle_seconds()
        if idle is not None and start[2] is not None:
            # The host's spare CPU over the call, shared by the ranks on it.
            spare = (idle - start[2]) / max(1, int(comm.local_world_size))
        else:
            spare = wall - cpu  # this process's waiting, where the host does not say
        mine = max(0.0, spare) / max(codec_seconds, 1e-9)
        agreed = comm.all_reduce(np.array([mine]), "min")
        ratio = float(agreed[0])
        self.ratios[key] = ratio
        return ratio >= THRESHOLD


_TICKS = None


def host_idle_seconds() -> Optional[float]:
    """The CPU seconds this host's processors have spent idle since boot (every CPU's,
    from /proc/stat: idle and iowait), or None where there is no /proc/stat."""
    global _TICKS
    try:
        with open("/proc/stat", "rb") as f:
            fields = f.readline().split()
        if _TICKS is None:
            _TICKS = float(os.sysconf("SC_CLK_TCK"))
        return (int(fields[4]) + int(fields[5])) / _TICKS
    except (OSError, ValueError, IndexError):
        return None
