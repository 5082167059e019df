"""Collectives built from the engine's own: Python objects (pickled) and gathers of
arrays whose first dimension differs between ranks."""

from __future__ import annotations

import pickle
from typing import Any, List

import numpy as np

from .._arrays.buffer import describe
from .._arrays.kinds import array_for

__all__ = ["all_gather_object", "all_gather_uneven", "broadcast_object"]


def _lengths(comm: Any, n: int) -> List[int]:
    """Every rank's n, in rank order."""
    return [int(v) for v in comm.all_gather(np.array([n], dtype=np.int64)).reshape(-1)]


def all_gather_object(comm: Any, obj: Any) -> List[Any]:
    """Every rank's obj, in rank order (pickled; one gather of sizes, one of bytes)."""
    data = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), dtype=np.uint8)
    sizes = _lengths(comm, data.size)
    padded = np.zeros(max(sizes), dtype=np.uint8)
    padded[: data.size] = data
    rows = comm.all_gather(padded)
    return [pickle.loads(rows[r, : sizes[r]].tobytes()) for r in range(comm.world_size)]


def broadcast_object(comm: Any, obj: Any, root: int) -> Any:
    """root's obj on every rank (pickled: one broadcast of the size, one of the bytes)."""
    data = b""
    if comm.rank == root:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    size = np.array([len(data)], dtype=np.int64)
    comm.broadcast(size, root=root)
    buf = np.zeros(int(size[0]), dtype=np.uint8)
    if comm.rank == root:
        buf[:] = np.frombuffer(data, dtype=np.uint8)
    comm.broadcast(buf, root=root)
    return obj if comm.rank == root else pickle.loads(buf.tobytes())


def all_gather_uneven(comm: Any, x: Any) -> Any:
    """Every rank's x concatenated along the first axis, in rank order; the first
    dimension may differ between ranks, the rest of the shape and the dtype may not.
    The result is the same kind of array as x (torch in, torch out)."""
    buf = describe(x, "x")
    if len(buf.shape) == 0:
        raise ValueError("x: all_gather with uneven=True needs at least one dimension")
    rest = tuple(buf.shape[1:])
    header = np.array([buf.shape[0], len(rest), *rest], dtype=np.int64)
    shapes = comm.all_gather_object((tuple(int(v) for v in header), buf.dtype))
    for r, (theirs, dtype) in enumerate(shapes):
        if theirs[2:] != tuple(header[2:]) or dtype != buf.dtype:
            raise ValueError(
                f"all_gather(uneven=True): rank {r} passed {dtype} with trailing shape "
                f"{theirs[2:]}, rank {comm.rank} {buf.dtype} with {tuple(header[2:])}; only "
                "the first dimension may differ"
            )
    lengths = [theirs[0] for theirs, _ in shapes]
    kind, arr = array_for(buf, "x")
    padded = kind.zeros(arr, (max(lengths), *rest))
    if buf.shape[0]:
        kind.assign(kind.view(padded.reshape(-1), 0, buf.shape), arr)
    rows = comm.all_gather(padded)
    pieces = [rows[r][: lengths[r]] for r in range(comm.world_size)]
    if type(rows).__module__.startswith("torch"):
        import torch

        return torch.cat(pieces)
    return np.concatenate(pieces)
