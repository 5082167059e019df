"""Memory the ranks of a host read from each other: ``Communicator.empty``
(MPI_Win_allocate_shared's idea, NCCL's registered user buffers).

An all_reduce whose input and output come from ``empty`` on every rank reads the
peers' inputs where they are: each rank reduces its chunk straight out of every
rank's input and writes it into every rank's output. One copy, where the ring copies
every message into shared memory and out again (the engine's
algorithms/window_all_reduce.h).
"""

from __future__ import annotations

from typing import Any, Sequence, Union

import numpy as np

from ... import _core

__all__ = ["empty"]


def empty(comm: Any, shape: Union[int, Sequence[int]], dtype: Any) -> np.ndarray:
    """``comm.empty``: a zeroed numpy array in a window of ``comm`` (collective), or a
    plain one where the ranks do not all share this host."""
    dt = np.dtype(dtype)
    dims = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    if not all(isinstance(d, (int, np.integer)) and d >= 0 for d in dims):
        raise ValueError(f"shape must be non-negative integers, got {shape!r}")
    count = int(np.prod(dims, dtype=np.int64))
    nbytes = count * dt.itemsize
    window = comm._issue(
        _core.Collective.ALL_GATHER, comm._core.allocate_window, max(nbytes, dt.itemsize, 1)
    )
    if window is None:
        return np.zeros(dims, dt)
    return np.frombuffer(window, dtype=dt, count=count).reshape(dims)
