"""Calibration: the links' alpha and beta, and gamma, fitted to measured calls."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from .cost import CostModel
from .link import DEFAULT_SEGMENT_BYTES, DEFAULT_SMALL_BYTES, Link


@dataclass(frozen=True)
class Sample:
    """One measured call: ``seconds`` per call of ``collective`` on ``nbytes`` arrays,
    ``ranks`` ranks on one host over link kind ``link``."""

    collective: str
    nbytes: float
    ranks: int
    link: str
    seconds: float
    algorithm: Optional[str] = None


def _coefficients(sample: Sample, small_bytes: int, segment_bytes: int) -> dict[str, float]:
    """The sample's time as a linear form in alpha_<link>, beta_<link> and gamma."""
    m = CostModel(
        ranks_per_host=sample.ranks,
        intra_link=sample.link,
        links={sample.link: Link(0.0, 0.0)},
        small_bytes=small_bytes,
        segment_bytes=segment_bytes,
    )
    phases, _, _ = m.phases(sample.collective, sample.nbytes, sample.algorithm)
    coef = {f"alpha_{sample.link}": 0.0, f"beta_{sample.link}": 0.0, "gamma": 0.0}
    for p in phases:
        coef[f"alpha_{p.link}"] += p.steps
        coef[f"beta_{p.link}"] += p.wire_bytes
        coef["gamma"] += p.reduce_bytes
    return coef


def fit(
    samples: Sequence[Sample],
    *,
    small_bytes: int = DEFAULT_SMALL_BYTES,
    segment_bytes: int = DEFAULT_SEGMENT_BYTES,
) -> tuple[dict[str, Link], Optional[float]]:
    """Fits alpha and beta per link kind, and one reduction rate, to measured calls.

    Least squares on relative error (every size counts alike), with every parameter
    >= 0: each sample's time is linear in the parameters (:meth:`CostModel.phases`).
    Calls that reduce (all_reduce) next to calls that do not (all_gather) separate the
    reduction from the wire. Returns ``(links, reduce_gbs)``; reduce_gbs is None when
    the fit finds the reduction hidden (gamma = 0).
    """
    rows = [_coefficients(s, small_bytes, segment_bytes) for s in samples]
    names = sorted({k for r in rows for k in r if any(r2.get(k, 0.0) > 0 for r2 in rows)})
    if not names:
        raise ValueError("fit: no samples with a cost (need at least 2 ranks)")
    a = np.array([[r.get(k, 0.0) for k in names] for r in rows])
    y = np.array([s.seconds for s in samples], dtype=np.float64)
    if not np.all(y > 0):
        raise ValueError("fit: every sample needs a positive time")
    a, y = a / y[:, None], np.ones_like(y)
    scale = np.abs(a).max(axis=0)
    x = _nnls(a / scale, y) / scale
    value = dict(zip(names, x))
    links = {}
    for kind in sorted({s.link for s in samples}):
        links[kind] = Link(
            float(value.get(f"alpha_{kind}", 0.0)), float(value.get(f"beta_{kind}", 0.0))
        )
    gamma = float(value.get("gamma", 0.0))
    return links, (1e-9 / gamma if gamma > 0 else None)


def _nnls(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """min |a x - y| with x >= 0, by trying every set of free parameters (a handful)."""
    best, best_x = math.inf, np.zeros(a.shape[1])
    for k in range(1, a.shape[1] + 1):
        for cols in itertools.combinations(range(a.shape[1]), k):
            sub, *_ = np.linalg.lstsq(a[:, cols], y, rcond=None)
            if np.any(sub < 0):
                continue
            x = np.zeros(a.shape[1])
            x[list(cols)] = sub
            residual = float(np.sum((a @ x - y) ** 2))
            if residual < best:
                best, best_x = residual, x
    return best_x
