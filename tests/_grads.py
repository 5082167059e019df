"""Gradients for the bucketing tests, in host memory or on the fake device."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Optional, Tuple

import numpy as np
from _fake_cuda import FakeKind, fake, fake_kind

SHAPES = [(5,), (2, 3), (4,), (3, 3)]

# Where gradients live: numpy arrays, or FakeCudaArray on the engine's fake device
# (RankGroup with fake_device=True), whose buckets the bucketer then keeps "on the GPU".
MEMORY = ["host", "fake-device"]


def int_grad(rank: int, index: int, micro: int, shape) -> np.ndarray:
    """Small integers: sums and halves are exact in every float dtype used here."""
    return np.full(shape, float((rank + 1) * (micro + 2) + index), dtype=np.float64)


@contextlib.contextmanager
def handing_over(memory: str) -> Iterator[Tuple[Callable[[np.ndarray], Any], Optional[FakeKind]]]:
    """(wrap, kind): wrap(a) is the gradient to hand to ready() for the numpy array a,
    sharing its memory, so a holds the result after wait(); kind counts the arrays
    allocated on the fake device (None on the host)."""
    if memory == "host":
        yield (lambda a: a), None
        return
    with fake_kind() as kind:
        yield fake, kind
