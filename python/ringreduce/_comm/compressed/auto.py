"""auto's calibration (compression/policy.py's cost model, fed here): after the timed
exact calls of a size class, every rank times a tiny exact call and a tiny call through
each candidate codec, and the ranks agree on the median of what each measured.

The calls are the same on every rank, so the call numbers (the dither's seeds) stay
equal; they run where the call that ends the calibration runs (the caller's thread, or
the lane's for an async call), as blocking calls.
"""

from __future__ import annotations

import time
from typing import Any, Dict

import numpy as np

from ...compression import canary as _canary
from ...compression import policy as _policy
from ...compression.codecs import get_codec

__all__ = ["calibrate"]

_TINY = 1024  # values of the calls that time each path's fixed cost


def calibrate(comm: Any, st: Any, seconds: float, nbytes: int) -> None:
    """A timed exact call of auto's calibration. After the last one, every rank times a
    tiny exact call and a tiny call through each candidate (the same calls everywhere,
    so call numbers stay equal; the codecs' counters are left as they were), and the
    numbers are agreed."""
    if not st.auto.note_calibration(seconds, nbytes):
        return
    tiny = np.random.default_rng(0).standard_normal(_TINY, dtype=np.float32)

    def best_of(call: Any) -> float:
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            call()
            times.append(time.perf_counter() - t0)
        return min(times)

    alpha_exact = best_of(lambda: comm.all_reduce(tiny))
    st.timing = True
    try:
        alphas = _time_codecs(comm, st, tiny, best_of)
    finally:
        st.timing = False
    # The median over ranks: one rank descheduled through its short codec probe (4 ranks
    # on 2 cores) read a codec 10x slower than it runs, and the maximum took that.
    mine = st.auto.measured(alpha_exact, alphas, nbytes)
    st.auto.agree(np.median(np.asarray(comm.all_gather(mine)), axis=0), nbytes)


def _time_codecs(comm: Any, st: Any, tiny: np.ndarray, best_of: Any) -> Dict[str, float]:
    """Seconds of a tiny call through each candidate codec, leaving its counters as they
    were."""
    alphas = {}
    for name in _policy.CANDIDATES:
        before = st.codecs.get(name)
        kept = None if before is None else _canary.CodecStats()
        if kept is not None:
            vars(kept).update(vars(before))
        codec = get_codec(name)
        alphas[name] = best_of(lambda c=codec: comm.all_reduce(tiny, compression=c))
        if kept is None:
            st.codecs.pop(name, None)
        else:
            st.codecs[name] = kept
    return alphas
