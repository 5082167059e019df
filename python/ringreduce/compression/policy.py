"""When compression pays: the settings of the compressed collectives and the cost model
behind ``compression="auto"``.

Compression trades link time for codec time, and one exchange for two. With S bytes of
input and S_c of payload, a ring (or the one-hop exchange) moves 2(N-1)/N of them, so
per call

    time_exact = alpha_exact + S * beta
    time_codec = alpha_codec + S_c * beta + codec seconds (encode n values, decode 2n)

and "auto" compresses when time_codec < MARGIN * time_exact. Nothing is assumed: the
first ``CALIBRATION_CALLS`` auto calls of at least ``MIN_BYTES`` run exact and are timed;
then every rank times a tiny exact call and a tiny call through each candidate codec
(the alphas: latency, the second exchange, the Python path), and beta is what the
calibration calls took beyond alpha_exact, per byte (it folds in 2(N-1)/N). Each codec's
speed is measured on the calibration call's size (1-8 Mi values), by every rank at
once, as the ranks of a compressed call run their codecs at once: on a shared host that
is the speed they get (a small probe, run alone, read 2-6x faster than the codecs ran
inside 64 MB calls at 4 ranks on 2 cores). Ranks measure different numbers, yet must
take the same path (a different collective on one rank would pair with the wrong call),
so the numbers are agreed, their median over ranks, by one small all_gather;
decisions are then a function of agreed numbers and the call's size, the same on every
rank. The model's crossover, the size from which each codec pays, is in ``comm.stats()``.

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
    ``piece_values``: a call whose chunks (its count / the world size) hold at least twice
    this many values may run in pieces of this many values per chunk or more (up to 64
    in the engine's collective, 16 on the Python path; the last may be shorter), each
    encoded while the one before travels; 0 runs every call whole.
    ``pieces``: "auto" (the engine's collective: in pieces where the ranks span hosts;
    the Python path: where the first call of a codec and size class showed spare CPU
    for at least half the codec's time on every rank, `compressed/pieces.py`), "always"
    or "never". Calls over shared memory always run whole.
    """

    canary_every: int = 50
    canary_sample: int = 1024
    piece_values: int = 1 << 16
    pieces: str = "auto"
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
    piece_values: Optional[int] = None,
    pieces: Optional[str] = None,
) -> Settings:
    """Changes the settings of this process's compressed collectives; returns them.
    Every rank must use the same ``canary_every``, ``canary_sample`` (the canary is a
    collective), ``piece_values`` and ``pieces`` (how a call is cut into exchanges).
    ``max_error`` updates the thresholds of the codecs it names."""
    if pieces is not None:
        if pieces not in ("auto", "always", "never"):
            raise ValueError(f"pieces must be 'auto', 'always' or 'never', got {pieces!r}")
        _SETTINGS.pieces = pieces
    if piece_values is not None:
        if int(piece_values) < 0:
            raise ValueError(f"piece_values must be >= 0 (0: calls run whole), got {piece_values}")
        _SETTINGS.piece_values = int(piece_values)
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

# (codec name, probe size) -> (encode, decode) s per value
_SPEED: Dict[Tuple[str, int], Tuple[float, float]] = {}
_PROBE_VALUES = (1 << 18, 1 << 23)  # the probe's size: the calls', within these


def codec_seconds_per_value(codec: Codec, values: int = 1 << 20) -> Tuple[float, float]:
    """(encode, decode) seconds per value of ``codec`` in this process, measured once per
    power of 4 of ``values`` (kept within 256 Ki-8 Mi, rounded down to a power of 4) on
    that many values of Gaussian noise, the best of three runs."""
    n = min(max(int(values), _PROBE_VALUES[0]), _PROBE_VALUES[1])
    n = 1 << (2 * ((n.bit_length() - 1) // 2))  # one probe per power of 4, rounded down
    known = _SPEED.get((codec.name, n))
    if known is None:
        x = np.random.default_rng(0).standard_normal(n, dtype=np.float32)
        enc = dec = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            payload = codec.encode(x, 1)
            t1 = time.perf_counter()
            codec.decode(payload, x.size)
            t2 = time.perf_counter()
            enc, dec = min(enc, t1 - t0), min(dec, t2 - t1)
        known = _SPEED[(codec.name, n)] = (enc / x.size, dec / x.size)
    return known


# ---- the decision ---------------------------------------------------------------


@dataclass
class Decision:
    """What auto chose for one call (``codec`` None: exact), and why, in words."""

    codec: Optional[str]
    why: str
    calibrating: bool = False


def size_class(nbytes: int) -> int:
    """The size class of a call of ``nbytes``: calls within a factor of 4 share one
    calibration (256 KiB-1 MiB, 1-4 MiB, ...)."""
    return (max(int(nbytes), 1).bit_length() - 1) // 2


@dataclass
class _Fit:
    """One size class's calibration: the timed exact calls, then the agreed numbers."""

    samples: List[Tuple[float, int]] = field(default_factory=list)  # (seconds, bytes)
    beta: Optional[float] = None  # seconds per input byte beyond alpha_exact
    alpha_exact: float = 0.0  # seconds of a tiny exact call
    alphas: Dict[str, float] = field(default_factory=dict)  # of a tiny call, per candidate
    speeds: Dict[str, Tuple[float, float]] = field(default_factory=dict)  # enc, dec s/value

    def work(self, name: str, n: int, feedback: bool) -> float:
        enc, dec = self.speeds[name]
        return n * (enc + (3 if feedback else 2) * dec)


class AutoPolicy:
    """One communicator's auto decisions. ``never``: exact without measuring (a world of
    one; every rank on one host over shared memory).

    Each size class (a factor of 4) is calibrated on its own first calls: what a byte
    costs depends on the size (caches, TCP windows, the codecs' working set), and a
    model fitted on 256 KiB calls mispredicted 16 MiB ones by up to 2x."""

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
        self.fits: Dict[int, _Fit] = {}  # by size class
        self.last: Optional[_Fit] = None  # the last class calibrated
        self.chosen: Dict[str, int] = {}
        # The last calibrated decision's predicted seconds per path ("exact" and each
        # candidate) and its input bytes, for stats(): the model, open to checking.
        self.predicted: Optional[Dict[str, float]] = None

    @property
    def calibrated(self) -> bool:
        """Whether some size class has been calibrated."""
        return self.last is not None

    @property
    def measuring(self) -> bool:
        """Whether a calibration call has been timed."""
        return bool(self.fits)

    def _fit(self, nbytes: int) -> Optional[_Fit]:
        """The calibrated fit for a call of ``nbytes``: its class's, else the nearest
        calibrated class's (None before any)."""
        done = {c: f for c, f in self.fits.items() if f.beta is not None}
        if not done:
            return None
        cls = size_class(nbytes)
        return done.get(cls) or done[min(done, key=lambda c: (abs(c - cls), c))]

    def decide(self, n: int, itemsize: int, dtype: str, feedback: bool) -> Decision:
        """The path of a call of n values of ``itemsize`` bytes (the same on every rank)."""
        nbytes = n * itemsize
        if self.never is not None:
            return Decision(None, f"exact: {self.never}")
        if dtype == "float64":
            return Decision(None, "exact: float64 is never compressed (codecs sum in float32)")
        if nbytes < MIN_BYTES:
            return Decision(None, f"exact: {nbytes} B is below {MIN_BYTES} B, latency-bound")
        fit = self.fits.get(size_class(nbytes))
        if fit is None or fit.beta is None:
            taken = 0 if fit is None else len(fit.samples)
            return Decision(
                None,
                f"exact, timed to measure the link at this size (calibration call "
                f"{taken + 1} of {CALIBRATION_CALLS})",
                calibrating=True,
            )
        predicted, parts = self.predict(n, itemsize, feedback)
        t_exact = predicted["exact"]
        best, best_t = None, t_exact
        for name in CANDIDATES:
            t = predicted[name]
            if t < MARGIN * t_exact and t < best_t:
                best, best_t = name, t
        verdict = best or "exact"
        self.predicted = predicted
        return Decision(best, f"{', '.join(parts)} -> {verdict}")

    def predict(self, n: int, itemsize: int, feedback: bool) -> Tuple[Dict[str, float], list]:
        """The model's seconds for a call of n values, by path ("exact" and each
        candidate; "bytes": the input's), from its size class's calibration (or the
        nearest calibrated class's), and its terms in words."""
        nbytes = n * itemsize
        fit = self._fit(nbytes)
        assert fit is not None and fit.beta is not None, "predict() before calibration"
        beta = fit.beta
        t_exact = fit.alpha_exact + nbytes * beta
        parts = [
            f"exact {t_exact * 1e3:.3f} ms (link {1e-9 / beta:.2f} GB/s of input, "
            f"{fit.alpha_exact * 1e6:.0f} us a call, measured)"
        ]
        predicted = {"bytes": float(nbytes), "exact": t_exact}
        for name in CANDIDATES:
            wire = get_codec(name).payload_bytes(n) * beta
            work = fit.work(name, n, feedback)
            t = predicted[name] = fit.alphas[name] + wire + work
            parts.append(
                f"{name} {t * 1e3:.3f} ms (wire {wire * 1e3:.3f} + codec {work * 1e3:.3f} "
                f"+ {fit.alphas[name] * 1e6:.0f} us a call)"
            )
        return predicted, parts

    def crossover_bytes(self, feedback: bool = False) -> Dict[str, float]:
        """Per candidate, the float32 input size from which the model predicts that it
        is faster than exact (inf: at no size; 0: at every size), from the calibrated
        classes in order of size: in the first one where the codec pays at the class's
        top, where its line crosses exact's (the smallest class's line is followed down
        to any size); {} before calibration."""
        done = sorted((c, f) for c, f in self.fits.items() if f.beta is not None)
        out: Dict[str, float] = {}
        for name in CANDIDATES if done else ():
            out[name] = float("inf")
            for i, (cls, fit) in enumerate(done):
                top = 1 << (2 * cls + 2)
                ratio = get_codec(name).payload_bytes(top // 4) / top
                gain = fit.beta * (1 - ratio) - fit.work(name, top // 4, feedback) / top
                extra = fit.alphas[name] - fit.alpha_exact
                if gain <= 0 or extra > gain * top:
                    continue  # no saving anywhere in this class
                low = 0 if i == 0 else 1 << (2 * cls)
                out[name] = max(float(low), extra / gain, 0.0)
                break
        return out

    def note_calibration(self, seconds: float, nbytes: int) -> bool:
        """Records a timed exact call; True once its size class has enough (then
        `measured`, and `agree` with what the ranks agreed)."""
        fit = self.fits.setdefault(size_class(nbytes), _Fit())
        fit.samples.append((seconds, max(nbytes, 1)))
        return len(fit.samples) >= CALIBRATION_CALLS

    def measured(self, alpha_exact: float, alphas: Dict[str, float], nbytes: int) -> np.ndarray:
        """This rank's numbers to agree on for ``nbytes``'s class, from its calibration
        calls and the tiny calls' seconds: beta, alpha_exact, then each candidate's
        encode and decode seconds per value (measured on the calls' size) and alpha."""
        fit = self.fits[size_class(nbytes)]
        seconds, size = min(fit.samples, key=lambda s: s[0] / s[1])
        mine = [max(seconds - alpha_exact, 0.5 * seconds) / size, alpha_exact]
        for name in CANDIDATES:
            mine.extend(codec_seconds_per_value(get_codec(name), size // 4))
            mine.append(alphas[name])
        return np.array(mine, np.float64)

    def agree(self, agreed: np.ndarray, nbytes: int) -> None:
        """Takes the numbers every rank agreed on (their median) for ``nbytes``'s class."""
        fit = self.fits.setdefault(size_class(nbytes), _Fit())
        fit.beta, fit.alpha_exact = float(agreed[0]), float(agreed[1])
        for i, name in enumerate(CANDIDATES):
            enc, dec, alpha = (float(v) for v in agreed[2 + 3 * i : 5 + 3 * i])
            fit.speeds[name] = (enc, dec)
            fit.alphas[name] = alpha
        self.last = fit
