"""Collectives built from the engine's own: Python objects (pickled), gathers of
arrays whose first dimension differs between ranks, and state handed to newcomers."""

from __future__ import annotations

import pickle
from typing import Any, Dict, List, Optional

import numpy as np

from ..._arrays.buffer import describe
from ..._arrays.kinds import array_for

__all__ = ["all_gather_object", "all_gather_uneven", "broadcast_object", "share_state"]


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


def share_state(comm: Any, state: Optional[Dict[str, Any]]) -> Dict[str, np.ndarray]:
    """Every rank ends with the holders' state: ranks that hold it pass a dict of name ->
    numpy array (the same names, shapes and dtypes on every holder), newcomers pass None
    and get new arrays. Striped: the state is packed into one buffer and each holder
    sends only its 1/H share of it, in one all_gather, so a newcomer receives every byte
    once, from every holder at the same time, in one collective whatever the number of
    arrays (rather than one broadcast per array from one root)."""
    layout = None
    if state is not None:
        if not isinstance(state, dict):
            raise TypeError(
                f"share_state: state must be a dict or None, got {type(state).__name__}"
            )
        arrays = {str(k): np.ascontiguousarray(v) for k, v in state.items()}
        layout = [(k, a.dtype.name, tuple(a.shape)) for k, a in arrays.items()]
    layouts = comm.all_gather_object(layout)
    holders = [r for r, theirs in enumerate(layouts) if theirs is not None]
    if not holders:
        raise ValueError("share_state: no rank passed a state (holders pass a dict)")
    for r in holders[1:]:
        if layouts[r] != layouts[holders[0]]:
            raise ValueError(
                f"share_state: rank {r}'s state differs from rank {holders[0]}'s in names, "
                "shapes or dtypes; every holder must pass the same layout"
            )
    layout = layouts[holders[0]]
    sizes = [int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize for _, dt, shape in layout]
    total = sum(sizes)
    stripe = -(-total // len(holders)) if total else 0
    mine = np.zeros(stripe, dtype=np.uint8)
    if comm.rank in holders and stripe:
        packed = np.concatenate([a.reshape(-1).view(np.uint8) for a in arrays.values()])
        share = packed[holders.index(comm.rank) * stripe :][:stripe]
        mine[: share.size] = share
    if comm.rank in holders:
        if stripe:
            comm.all_gather(mine)
        return arrays
    rows = comm.all_gather(mine) if stripe else np.zeros((comm.world_size, 0), np.uint8)
    packed = rows[holders].reshape(-1)[:total]
    out: Dict[str, np.ndarray] = {}
    offset = 0
    for (name, dt, shape), size in zip(layout, sizes):
        out[name] = packed[offset : offset + size].view(np.dtype(dt)).reshape(shape).copy()
        offset += size
    return out
