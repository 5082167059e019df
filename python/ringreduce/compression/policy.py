"""When compression pays: the settings of the compressed collectives and the cost model
behind ``compression="auto"``.

Compression trades link time for codec time. With S bytes of input and S_c of payload,
a ring (or the one-hop exchange) moves 2(N-1)/N of them, so per call

    time_exact = 2(N-1)/N * S   * beta
    time_codec = 2(N-1)/N * S_c * beta + codec seconds (encode n values, decode 2n)

and "auto" compresses when time_codec < MARGIN * time_exact. beta is not assumed: the
first ``CALIBRATION_CALLS`` auto calls of at least ``MIN_BYTES`` run exact and are timed
(seconds per input byte, which folds in 2(N-1)/N and the link's latency at that size),
and each codec's speed is measured once per process on first use. Ranks measure
different numbers, yet must take the same path (a different collective on one rank
would pair with the wrong call), so the numbers are agreed, their maximum over ranks,
by one small all_reduce after the calibration calls; decisions are then a function of
agreed numbers and the call's size, the same on every rank.

Where the answer is known, nothing is measured: a world of one, or every rank on one
host over shared memory (memory moves bytes faster than numpy encodes them), always
run exact.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np

from .codecs import Codec, get_codec

__all__ = ["AutoPolicy", "Settings", "codec_seconds_per_value", "configure", "settings"]

# Codecs auto chooses from, fastest first. int4 is left out: its error (about 9% on
# Gaussian data) is a choice to make knowingly, not one a cost model should make.
CANDIDATES = ("bf16", "int8")
MIN_BYTES = 256 * 1024  # below: latency-bound, two exchanges cost more than they save
CALIBRATION_CALLS = 2
MARGIN = 0.8  # compress only for a predicted saving of 20% or more: measurements are noisy


@dataclass
class Settings:
    """Process-wide settings of the compressed collectives (change with `configure`).

    ``canary_every``: the quality canary runs on every K-th compressed call of a
    communicator (the first included); 0 turns it off. ``canary_sample``: how many
    coordinates it compares. ``max_error``: relative error past which a codec falls
    back to the exact path, by codec name (a codec not named uses its ``max_error``).
    """

    canary_every: int = 50
    canary_sample: int = 1024
    max_error: Dict[str, float] = field(default_factory=dict)

    def threshold(self, codec: Codec) -> float:
        return float(self.max_error.get(codec.name, codec.max_error))


_SETTINGS = Settings()


def settings() -> Settings:
    """The settings in force."""
    return _SETTINGS


def configure(
    *,
    canary_every: Optional[int] = None,
    canary_sample: Optional[int] = None,
    max_error: Optional[Dict[str, float]] = None,
) -> Settings:
    """Changes the settings of this process's compressed collectives; returns them.
    Every rank must use the same ``canary_every`` and ``canary_sample`` (the canary is a
    collective). ``max_error`` updates the thresholds of the codecs it names."""
    if canary_every is not None:
        if int(canary_every) < 0:
            raise ValueError(f"canary_every must be >= 0 (0: off), got {canary_every}")
        _SETTINGS.canary_every = int(canary_every)
    if canary_sample is not None:
        if int(canary_sample) < 1:
            raise ValueError(f"canary_sample must be >= 1, got {canary_sample}")
        _SETTINGS.canary_sample = int(canary_sample)
    if max_error is not None:
        for name, value in max_error.items():
            get_codec(name)  # ValueError for an unknown codec
            if not float(value) > 0:
                raise ValueError(f"max_error[{name!r}] must be positive, got {value}")
            _SETTINGS.max_error[name] = float(value)
    return _SETTINGS


# ---- codec speed ---------------------------------------------------------------

_SPEED: Dict[str, Tuple[float, float]] = {}  # codec name -> (encode, decode) s per value
_PROBE_VALUES = 1 << 20


def codec_seconds_per_value(codec: Codec) -> Tuple[float, float]:
    """(encode, decode) seconds per value of ``codec`` in this process, measured once
    on 1 Mi values of Gaussian noise (the best of two runs)."""
    known = _SPEED.get(codec.name)
    if known is None:
        x = np.random.default_rng(0).standard_normal(_PROBE_VALUES, dtype=np.float32)
        enc = dec = float("inf")
        for _ in range(2):
            t0 = time.perf_counter()
            payload = codec.encode(x, 1)
            t1 = time.perf_counter()
            codec.decode(payload, x.size)
            t2 = time.perf_counter()
            enc, dec = min(enc, t1 - t0), min(dec, t2 - t1)
        known = _SPEED[codec.name] = (enc / x.size, dec / x.size)
    return known


# ---- the decision ---------------------------------------------------------------


@dataclass
class Decision:
    """What auto chose for one call (``codec`` None: exact), and why, in words."""

    codec: Optional[str]
    why: str
    calibrating: bool = False


class AutoPolicy:
    """One communicator's auto decisions. ``never``: exact without measuring (a world of
    one; every rank on one host over shared memory)."""

    def __init__(self, world_size: int, transport: str):
        self.world_size = world_size
        self.never: Optional[str] = None
        if world_size == 1:
            self.never = "a world of one sends nothing"
        elif transport == "shm":
            self.never = (
                "every rank is on this host over shared memory, which moves bytes faster "
                "than the codecs encode them"
            )
        self.samples: List[float] = []  # seconds per input byte of the calibration calls
        self.link_s_per_byte: Optional[float] = None  # agreed
        self.speeds: Dict[str, Tuple[float, float]] = {}  # agreed, per candidate
        self.chosen: Dict[str, int] = {}
        # The last calibrated decision's predicted seconds per path ("exact" and each
        # candidate) and its input bytes, for stats(): the model, open to checking.
        self.predicted: Optional[Dict[str, float]] = None

    @property
    def calibrated(self) -> bool:
        return self.link_s_per_byte is not None

    def decide(self, n: int, itemsize: int, dtype: str, feedback: bool) -> Decision:
        """The path of a call of n values of ``itemsize`` bytes (the same on every rank)."""
        nbytes = n * itemsize
        if self.never is not None:
            return Decision(None, f"exact: {self.never}")
        if dtype == "float64":
            return Decision(None, "exact: float64 is never compressed (codecs sum in float32)")
        if nbytes < MIN_BYTES:
            return Decision(None, f"exact: {nbytes} B is below {MIN_BYTES} B, latency-bound")
        if not self.calibrated:
            return Decision(
                None,
                f"exact, timed to measure the link (calibration call {len(self.samples) + 1} "
                f"of {CALIBRATION_CALLS})",
                calibrating=True,
            )
        t_exact = nbytes * self.link_s_per_byte
        parts = [
            f"exact {t_exact * 1e3:.3f} ms (link {1e-9 / self.link_s_per_byte:.2f} GB/s "
            "of input, measured)"
        ]
        best, best_t = None, t_exact
        predicted = {"bytes": float(nbytes), "exact": t_exact}
        for name in CANDIDATES:
            codec = get_codec(name)
            enc, dec = self.speeds[name]
            wire = codec.payload_bytes(n) / nbytes * t_exact
            work = n * (enc + (3 if feedback else 2) * dec)
            t = predicted[name] = wire + work
            parts.append(
                f"{name} {t * 1e3:.3f} ms (wire {wire * 1e3:.3f} + codec {work * 1e3:.3f})"
            )
            if t < MARGIN * t_exact and t < best_t:
                best, best_t = name, t
        verdict = best or "exact"
        self.predicted = predicted
        return Decision(best, f"{', '.join(parts)} -> {verdict}")

    def note_calibration(self, seconds: float, nbytes: int) -> Optional[np.ndarray]:
        """Records a timed exact call; once enough are in, the numbers to agree on (this
        rank's seconds per byte, then each candidate's encode and decode seconds per
        value), for `agree`; else None."""
        self.samples.append(seconds / max(nbytes, 1))
        if len(self.samples) < CALIBRATION_CALLS:
            return None
        mine = [min(self.samples)]
        for name in CANDIDATES:
            mine.extend(codec_seconds_per_value(get_codec(name)))
        return np.array(mine, np.float64)

    def agree(self, agreed: np.ndarray) -> None:
        """Takes the numbers every rank agreed on (their maximum)."""
        self.link_s_per_byte = float(agreed[0])
        for i, name in enumerate(CANDIDATES):
            self.speeds[name] = (float(agreed[1 + 2 * i]), float(agreed[2 + 2 * i]))
