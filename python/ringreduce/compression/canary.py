"""The quality canary: now and then, measure the error a codec injects, and stop using
a codec that does harm.

On every K-th compressed call of a communicator (``Settings.canary_every``) the same
sample of coordinates on every rank (a seed from the call's number) is summed exactly,
in float64 from every rank's float32 input, and compared with what the compressed call
returned there. The comparison is made from gathered numbers, in the same order on
every rank, so every rank gets the same error and takes the same decision: a codec
whose error passes its threshold falls back to the exact path on that communicator,
and says so once (`CompressionWarning`).

Errors are relative to the exact sum over the sample: ``error = |r - s| / |s|`` (L2
norms) and ``bias = mean(r - s) / rms(s)``. Where the ranks' contributions cancel (a sum
much smaller than its parts) the relative error is large even for a good codec, and the
fallback is the right call there: the codec's error scales with the parts, not the sum.
"""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

__all__ = ["CodecStats", "CompressionWarning", "measure", "sample_indices"]


class CompressionWarning(RuntimeWarning):
    """A codec's measured error passed its threshold; the communicator now reduces
    exactly for that codec."""


def sample_indices(n: int, count: int, seed: int) -> np.ndarray:
    """Up to ``count`` distinct coordinates of n values, sorted, the same for one seed."""
    if n <= count:
        return np.arange(n)
    return np.unique(np.random.default_rng(seed).integers(0, n, count))


def measure(result: np.ndarray, exact: np.ndarray) -> Tuple[float, float]:
    """(relative L2 error, bias relative to the RMS) of ``result`` against ``exact``,
    over the coordinates where the exact sum is finite; (0, 0) where none is."""
    keep = np.isfinite(exact)
    r, s = result[keep].astype(np.float64), exact[keep]
    if s.size == 0:
        return 0.0, 0.0
    diff = r - s
    err, size = float(np.linalg.norm(diff)), float(np.linalg.norm(s))
    if size == 0.0:
        return (0.0, 0.0) if err == 0.0 else (float("inf"), float("inf"))
    rms = size / np.sqrt(s.size)
    return err / size, float(diff.mean() / rms)


class CodecStats:
    """One codec's counters on one communicator (``comm.stats()["compression"][name]``):
    calls, wire_bytes (sent by this rank, engine headers included), codec_seconds
    (encoding and decoding), the last canary's compression_error and bias, the worst
    error seen, canary_checks, fell_back (the canary switched the codec off) and
    fallbacks (calls run exact since)."""

    def __init__(self) -> None:
        self.calls = 0
        self.wire_bytes = 0
        self.codec_seconds = 0.0
        self.compression_error: Optional[float] = None
        self.worst_error: Optional[float] = None
        self.bias: Optional[float] = None
        self.canary_checks = 0
        self.fallbacks = 0
        self.fell_back = False

    def as_dict(self) -> dict:
        return dict(vars(self))

    def judge(self, rows: np.ndarray, limit: float) -> bool:
        """Records a canary from the gathered rows (rank, [input, compressed sum held],
        sample) and returns True when this is the call that switches the codec off.
        Every rank holds the same rows, so every rank returns the same answer."""
        exact = rows[:, 0].astype(np.float64).sum(axis=0)
        got = rows[:, 1].astype(np.float64).sum(axis=0)  # one rank holds each value
        err, bias = measure(got, exact)
        self.canary_checks += 1
        self.compression_error, self.bias = err, bias
        self.worst_error = err if self.worst_error is None else max(self.worst_error, err)
        if err > limit and not self.fell_back:
            self.fell_back = True
            return True
        return False
