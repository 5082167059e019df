"""The rows of a compressed exchange: what one rank sends another in one message.

A row is a 16-byte header, then a codec's payload, padded to a size every rank computes
alike: the payload of the longest chunk, rounded up to 8 bytes (so the float32 scales
of the next row stay aligned). The header carries what the ranks must agree on (the
number of values reduced, the codec's tag, the call's number), so that ranks calling
with different counts or codecs fail with a MismatchError instead of misreading bytes
whose sizes happen to match.
"""

from __future__ import annotations

import numpy as np

from ..errors import MismatchError
from .codecs import Codec

__all__ = ["HEADER", "check_headers", "header", "row_bytes"]

HEADER = 16


def row_bytes(codec: Codec, longest: int) -> int:
    """The size of every row of an exchange whose longest chunk holds ``longest`` values."""
    return HEADER + -(-codec.payload_bytes(longest) // 8) * 8


def header(n: int, codec: Codec, call_no: int) -> np.ndarray:
    """The 16 header bytes: n (uint64), then the codec's tag and the call's number."""
    return np.array([n, codec.tag | ((call_no & 0xFFFFFFFF) << 32)], np.uint64).view(np.uint8)


def check_headers(rows: np.ndarray, mine: np.ndarray, codec: Codec, rank: int, what: str) -> None:
    """MismatchError unless every row's header is ``mine``. Every rank receives every
    rank's header, so when ranks disagree all of them raise, at the same call."""
    heads = rows[:, :HEADER]
    if heads.tobytes() == mine.tobytes() * heads.shape[0]:  # the usual case, in ~1 us
        return
    theirs = np.ascontiguousarray(heads).view(np.uint64)
    bad = np.nonzero((theirs != mine.view(np.uint64)).any(axis=1))[0]
    if not bad.size:
        return
    r = int(bad[0])
    n_r, tag_r, call_r = int(theirs[r, 0]), int(theirs[r, 1]) & 0xFFFFFFFF, int(theirs[r, 1]) >> 32
    exc = MismatchError(
        f"rank {rank}: compressed {what}: rank {r} sent {n_r} values with codec tag "
        f"{tag_r:#x} (call {call_r}); this rank has {int(mine.view(np.uint64)[0])} with "
        f"{codec.name!r} (tag {codec.tag:#x}). Every rank must reduce the same number of "
        "values with the same codec, in the same order"
    )
    exc.reason, exc.ranks = "call", (r, rank)
    raise exc
