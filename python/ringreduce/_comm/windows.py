"""Memory the ranks of a host read from each other, as a method of Communicator:
``empty`` (MPI_Win_allocate_shared's idea, NCCL's registered user buffers).

An all_reduce whose input and output come from ``empty`` on every rank reads the
peers' inputs where they are: each rank reduces its chunk straight out of every
rank's input and writes it into every rank's output. One copy, where the ring copies
every message into shared memory and out again (the engine's
algorithms/window_all_reduce.h).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence, Union

import numpy as np

from .. import _core
from .refusal import collective

__all__ = ["Windows"]


class Windows:
    """Communicator's ``empty`` (a mixin: ``_core`` and ``_issue`` are the
    communicator's)."""

    _core: Any
    _issue: Callable[..., Any]
    world_size: int

    @collective
    def empty(self, shape: Union[int, Sequence[int]], dtype: Any = np.float32) -> np.ndarray:
        """A numpy array, zeroed, in memory that every rank of this host maps.

        Collective: every rank calls it, in the same order as its other collectives;
        each may ask for its own shape. The k-th call makes window k everywhere.

        An ``all_reduce`` whose input and ``out=`` (or one array, in place) come from
        ``empty`` on every rank takes the window path: each rank reduces its chunk
        straight out of the other ranks' arrays and writes it into theirs
        (``stats()["all_reduce_algorithms"]["window"]`` counts these calls); calls of
        up to 4 KiB per rank take the direct path, faster there.
        Every rank must then pass such arrays or none: a rank that passes other
        memory gets MismatchError, naming the window path. ``torch.from_numpy`` gives
        a tensor over the same memory.

        Keep the array while any rank may still pass its window: a rank whose
        peer's window is gone here refuses the call with an error saying so.
        Where the ranks do not all share one host, or on one rank, this is a plain
        ``numpy.zeros``, and all_reduce takes its usual path.
        """
        dt = np.dtype(dtype)
        dims = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        if not all(isinstance(d, (int, np.integer)) and d >= 0 for d in dims):
            raise ValueError(f"shape must be non-negative integers, got {shape!r}")
        count = int(np.prod(dims, dtype=np.int64))
        nbytes = count * dt.itemsize
        window = self._issue(
            _core.Collective.ALL_GATHER, self._core.allocate_window, max(nbytes, dt.itemsize, 1)
        )
        if window is None:
            return np.zeros(dims, dt)
        return np.frombuffer(window, dtype=dt, count=count).reshape(dims)
