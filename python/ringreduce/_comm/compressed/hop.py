"""The exchanges of a compressed collective (``compressed.py``): the one-hop scheme's
scatter and gather phases, and the "gather" algebra's single all_gather, written so
that a call passes over its data as few times as it can.

- The built-in codecs' C++ kernels write payloads straight into the rows that travel,
  decode straight into the result, add the owner's N-1 payloads in one pass
  (``decode_add``) and apply error feedback inside the encode (``x + residual`` in, the
  new residual out, one pass). Other codecs (and the built-ins under
  ``use_kernels(False)``) take their Python methods, with the same bytes and bits.
- float32 input is read where it is; float16 and bfloat16 input is widened once.
- The rows, the owner's sum and the widened input live in per-communicator `Scratch`
  buffers, reused from call to call: a 64 MB call no longer pays for touching ~200 MB
  of fresh pages.

Every function here returns or fills float32 sums in sum units; `compressed.py` checks
the arguments, runs the canary, divides for "avg" and casts to the input's dtype.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from ... import _core
from ...compression import rows as _rows
from ...compression.codecs import Codec, _Kernel, seed_key, use_kernels
from ...compression.rows import HEADER
from .pieces import pieces

__all__ = ["Scratch", "gathered", "one_hop", "seed", "widened"]

_F32 = np.float32
_SEED = 0x52494E47  # "RING": the base of every seed, the same on every rank
# Phases of a call, in its seeds.
WORKER, OWNER, GATHER, SAMPLE = 1, 2, 3, 4


def seed(call_no: int, phase: int, rank: int, chunk: int, piece: int = 0) -> int:
    """The seed of one encode: a function of the call's number (the same on every rank),
    the phase, the piece of a call run in pieces (`pieces`; 0 otherwise), the encoding
    rank and the chunk. Ranks' rounding noise is independent, so it grows as sqrt(N) in
    a sum, not N."""
    return (_SEED << 96) | (call_no << 40) | ((phase | piece << 3) << 32) | (rank << 16) | chunk


# ---- scratch buffers ---------------------------------------------------------------


class Scratch:
    """A communicator's reusable buffers, one per role ("send", "recv", "acc", "wide",
    "sum"), each grown to the largest call seen. At most ``LIMIT`` bytes are kept in
    all; a call that would pass it gets fresh arrays that go with it. Freed with the
    communicator (compressed.py keeps states in a WeakKeyDictionary).

    ``lock`` keeps two threads' calls out of one set of buffers: a call that finds it
    taken (collectives from two threads at once, an error the communicator reports)
    works on fresh arrays instead, so the buffers never mix two calls' data."""

    LIMIT = 512 << 20

    def __init__(self, keep: bool = True):
        self._kept: Dict[str, np.ndarray] = {}
        self._keep = keep
        self.lock = threading.Lock()

    def get(self, role: str, shape: Any, dtype: Any = np.uint8) -> np.ndarray:
        """An array of ``shape`` and ``dtype`` for ``role``: its contents are whatever
        the last call left (zeros the first time)."""
        dtype = np.dtype(dtype)
        nbytes = dtype.itemsize * (shape if isinstance(shape, int) else math.prod(shape))
        buf = self._kept.get(role)
        if buf is None or buf.nbytes < nbytes:
            others = sum(b.nbytes for r, b in self._kept.items() if r != role)
            if not self._keep or others + nbytes > self.LIMIT:
                return np.zeros(shape, dtype)
            self._kept.pop(role, None)  # the smaller one goes before the larger comes
            buf = self._kept[role] = np.zeros(nbytes, np.uint8)
        return buf[:nbytes].view(dtype).reshape(shape)

    def nbytes(self) -> int:
        """The bytes kept."""
        return sum(b.nbytes for b in self._kept.values())

    def clear(self) -> None:
        """Drops every buffer (the next call allocates afresh)."""
        self._kept.clear()


# ---- codec calls: the kernels where they apply, the codec's methods otherwise ------------


def _builtin(codec: Codec, *methods: str) -> bool:
    """Whether ``codec`` is a built-in one whose ``methods`` are the built-ins' own."""
    return isinstance(codec, _Kernel) and all(
        getattr(type(codec), m) is getattr(_Kernel, m) for m in methods
    )


def _kernel(codec: Codec) -> Optional[str]:
    """The C++ kernel's name when ``codec`` is a built-in one whose methods are the
    built-in ones and the kernels are on; None: call the codec's methods."""
    if not use_kernels() or not _builtin(
        codec, "encode", "decode", "decode_add", "encode_feedback"
    ):
        return None
    return codec.kernel


def _indexed(codec: Codec) -> bool:
    """Whether codec's encodes are the built-ins' own, which take ``first`` (x[0]'s index
    in the array x is a piece of; codecs.py's ``_Kernel``). A piece of such a codec is
    encoded at its index in the chunk with the chunk's seed, so a call in pieces gives
    the bits of the call whole. Other codecs' pieces get seeds of their own."""
    return _builtin(codec, "encode", "encode_feedback")


def _own(codec: Codec, method: str) -> bool:
    """Whether codec's class has its own ``method`` (fused decode_add, encode_feedback),
    rather than the generic one of Codec or the built-ins' (which would call encode and
    decode with arguments a subclass's own encode may not take)."""
    return getattr(type(codec), method) not in (getattr(Codec, method), getattr(_Kernel, method))


def _encode(
    codec: Codec,
    kernel: Optional[str],
    x: np.ndarray,
    key_seed: int,
    into: np.ndarray,
    residual: Optional[np.ndarray],
    first: int = 0,
) -> None:
    """The payload of x (float32, contiguous) into ``into``'s first bytes. With a
    residual: of ``x + residual``, leaving in it what the encode dropped. ``first``:
    x[0]'s index in its chunk, for codecs whose encodes take it (`_indexed`; 0
    otherwise)."""
    if kernel is not None:
        _core.codec_encode(kernel, x, seed_key(key_seed), into, residual, first=first)
        return
    at = {"first": first} if first else {}
    v = x
    if residual is not None and _own(codec, "encode_feedback"):
        payload = codec.encode_feedback(x, residual, key_seed)
    else:
        if residual is not None:
            v = x + residual
        payload = codec.encode(v, key_seed, **at)
    want = codec.payload_bytes(x.size)
    if not isinstance(payload, np.ndarray) or payload.dtype != np.uint8 or payload.size != want:
        raise ValueError(
            f"codec {codec.name!r}: encode of {x.size} values must return {want} uint8 "
            f"bytes (payload_bytes), got {getattr(payload, 'dtype', type(payload))} "
            f"of size {getattr(payload, 'size', '?')}"
        )
    into[:want] = payload
    if v is not x:
        residual[...] = v - np.asarray(codec.decode(payload, v.size), _F32)


def _decode(
    codec: Codec, kernel: Optional[str], payload: np.ndarray, m: int, out: np.ndarray
) -> None:
    """out (float32, m values) = the values of payload."""
    if kernel is not None:
        _core.codec_decode(kernel, payload, m, out)
    else:
        out[:] = np.asarray(codec.decode(payload[: codec.payload_bytes(m)], m), _F32)


def _decode_add(
    codec: Codec, kernel: Optional[str], payloads: Sequence[np.ndarray], m: int, acc: np.ndarray
) -> None:
    """acc += the values of each payload, in order, in float32."""
    if not payloads:
        return
    if kernel is not None:
        _core.codec_decode_add(kernel, payloads, m, acc)
    else:
        size = codec.payload_bytes(m)
        if _own(codec, "decode_add"):
            codec.decode_add([p[:size] for p in payloads], m, acc)
        else:
            for p in payloads:
                acc += np.asarray(codec.decode(p[:size], m), _F32)


def widened(flat: np.ndarray, scratch: Scratch) -> np.ndarray:
    """The input as float32: itself when it is float32, else a copy in scratch."""
    if flat.dtype == _F32:
        return flat if flat.flags.c_contiguous else np.ascontiguousarray(flat)
    wide = scratch.get("wide", flat.size, _F32)
    wide[...] = flat
    return wide


# ---- the phases --------------------------------------------------------------------


def _exchange(comm: Any, stat: Any, call: Any, alone: np.ndarray) -> np.ndarray:
    """Runs one exchange (``alone``: its result in a world of one), counting the bytes
    this rank sent."""
    if comm.world_size == 1:
        return alone
    before = comm._core.stats()["bytes_sent"]
    got = call()
    stat.wire_bytes += comm._core.stats()["bytes_sent"] - before
    return got


def one_hop(
    comm: Any,
    codec: Codec,
    x: np.ndarray,
    owned: bool,
    residual: Optional[np.ndarray],
    call_no: int,
    stat: Any,
    scratch: Scratch,
    target: np.ndarray,
    scatter: bool,
    piece_values: int = 0,
) -> np.ndarray:
    """The scatter and gather phases (compressed.py's docstring); the float32 sum in
    sum units, in ``target``: this rank's chunk (reduce_scatter; ``target`` may be
    anything but a view of the other chunks of x) or the whole array (all_reduce; may
    be x itself: each piece of x is read before that piece of target is written).
    ``x``: float32, contiguous; ``owned``: x is scratch this call may change (the
    widened input, not x itself).

    Large calls may run in pieces (`compressed_pieces`, ``piece_values``), so that the
    codec's work overlaps the exchanges. Pieces start at block boundaries, and the
    built-in codecs encode a piece at its index in the chunk with the chunk's seed, so
    a call in pieces gives the bits of the same call whole; other codecs' pieces have
    seeds of their own (the same on every rank)."""
    n, size, rank = x.size, comm.world_size, comm.rank
    bounds = [_core.chunk_bounds(n, size, k) for k in range(size)]
    parts = pieces(bounds, piece_values)
    count = len(parts)
    row = _rows.row_bytes(codec, max(hi - lo for part in parts for lo, hi in part))
    header = _rows.header(n, codec, call_no)
    what = "reduce_scatter" if scatter else "all_reduce"
    kernel = _kernel(codec)
    indexed = _indexed(codec)
    clock = [0.0]  # codec seconds

    def key(phase: int, chunk: int, p: int) -> int:  # the seed of chunk's piece p
        return seed(call_no, phase, rank, chunk, 0 if indexed else p)

    def at(chunk: int, a: int) -> int:  # where a piece starting at a lies in its chunk
        return a - bounds[chunk][0] if indexed else 0

    send = scratch.get("send", (count, size, row))
    send[:, :, :HEADER] = header
    recv = scratch.get("recv", (count, size, row)) if size > 1 else send

    # The owner's sum starts as its own contribution, never encoded.
    lo, hi = bounds[rank]
    t0 = time.perf_counter()
    own = x[lo:hi]
    acc = target if scatter else own if owned else scratch.get("acc", hi - lo, _F32)
    if residual is not None:
        np.add(own, residual[lo:hi], out=acc)
    elif acc is not own:
        acc[...] = own
    clock[0] += time.perf_counter() - t0

    def scatter_encode(p: int) -> None:  # chunk k of every rank to rank k, in its row
        t0 = time.perf_counter()
        for k, (a, b) in enumerate(parts[p]):
            if k != rank and b > a:  # the worker error stays with its sender
                _encode(
                    codec,
                    kernel,
                    x[a:b],
                    key(WORKER, k, p),
                    send[p, k, HEADER:],
                    None if residual is None else residual[a:b],
                    at(k, a),
                )
        clock[0] += time.perf_counter() - t0

    def owner_sum(p: int) -> None:  # + the N-1 payloads; then the sum encoded once
        a, b = parts[p][rank]
        t0 = time.perf_counter()
        mine = acc[a - lo : b - lo]
        if b > a:
            payloads = [recv[p, j, HEADER:] for j in range(size) if j != rank]
            _decode_add(codec, kernel, payloads, b - a, mine)
        if not scatter:
            # The gather's row is recv's own (its contents spent); the server error, in
            # sum units, stays with the owner.
            row_out = recv[p, rank]
            row_out[:HEADER] = header
            if b > a:
                owed = None
                if residual is not None:
                    owed = residual[a:b]
                    owed.fill(-0.0)  # mine + -0.0 is mine, bit for bit (signed zeros too)
                _encode(
                    codec, kernel, mine, key(OWNER, rank, p), row_out[HEADER:], owed, at(rank, a)
                )
        clock[0] += time.perf_counter() - t0

    def decode_all(p: int) -> None:  # every owner's sum of piece p, into target
        rows = send[p]  # spent by the scatter, so it received the gather
        _rows.check_headers(rows, header, codec, rank, what)
        t0 = time.perf_counter()
        for k, (a, b) in enumerate(parts[p]):
            if b > a:
                _decode(codec, kernel, rows[k, HEADER:], b - a, target[a:b])
        clock[0] += time.perf_counter() - t0

    background = count > 1  # pieces are queued to the engine, so they overlap the codec
    pending: List[Any] = []

    def launch(kind: str, p: int) -> Any:
        if size == 1:
            return None  # a world of one: the rows are where they would arrive
        if kind == "scatter":
            work = comm.all_to_all(send[p], out=recv[p], async_op=background)
        else:
            work = comm.all_gather(recv[p, rank], out=send[p], async_op=background)
        if background:
            pending.append(work)
            return work
        return None

    def finish(work: Any) -> None:
        if work is not None:
            work.wait()
            pending.remove(work)

    # Piece p+1 is encoded while piece p travels, and sent once piece p's headers showed
    # that every rank makes the same call (so ranks that do not, with counts that cut
    # differently, leave nothing queued when they raise). The engine runs exchanges one
    # at a time, in order: piece p's gather is queued behind piece p+1's scatter, so the
    # link has work while the owner decodes and re-encodes piece p. The order of the
    # exchanges is the same on every rank.
    before = comm._core.stats()["bytes_sent"] if size > 1 else 0
    try:
        scatter_encode(0)
        scattered = launch("scatter", 0)
        gathering = None
        for p in range(count):
            if p + 1 < count:
                scatter_encode(p + 1)
            finish(scattered)
            _rows.check_headers(recv[p], header, codec, rank, what)
            if p + 1 < count:
                scattered = launch("scatter", p + 1)
            owner_sum(p)
            if scatter:
                continue
            previous, gathering = gathering, launch("gather", p)
            if p >= 1:
                finish(previous)
                decode_all(p - 1)
        if not scatter:
            finish(gathering)
            decode_all(count - 1)
    except BaseException:
        # Exchanges still queued (or queued by a call that raised once it was queued:
        # ConcurrentUseError) read and write these buffers, which they keep alive: the
        # next call gets fresh ones. Those pending here end (or fail, within the
        # communicator's timeout) before this one raises; Ctrl-C stops the waiting.
        scratch.clear()
        for work in pending:
            try:
                work.wait()
            except Exception:
                pass
        raise
    if size > 1:
        stat.wire_bytes += comm._core.stats()["bytes_sent"] - before
    if scatter and residual is not None:
        residual[lo:hi] = 0  # sent whole: nothing owed
    stat.codec_seconds += clock[0]
    return acc if scatter else target


def gathered(
    comm: Any,
    codec: Codec,
    x: np.ndarray,
    residual: Optional[np.ndarray],
    call_no: int,
    stat: Any,
    scratch: Scratch,
    target: np.ndarray,
) -> np.ndarray:
    """A "gather" codec: every rank's whole payload to every rank, decoded and summed
    in rank order into ``target`` (float32, x's length; the same bits everywhere).
    Bytes grow with N."""
    size = comm.world_size
    kernel = _kernel(codec)
    header = _rows.header(x.size, codec, call_no)
    row = _rows.row_bytes(codec, x.size)
    mine = scratch.get("recv", row)
    mine[:HEADER] = header
    t0 = time.perf_counter()
    _encode(codec, kernel, x, seed(call_no, GATHER, comm.rank, 0), mine[HEADER:], residual)
    t_codec = time.perf_counter() - t0
    rows = _exchange(
        comm, stat, lambda: comm.all_gather(mine, out=scratch.get("send", (size, row))), mine[None]
    )
    _rows.check_headers(rows, header, codec, comm.rank, "all_reduce")
    t0 = time.perf_counter()
    target[...] = 0
    payloads: List[np.ndarray] = [rows[j, HEADER:] for j in range(size)]
    _decode_add(codec, kernel, payloads, x.size, target)
    stat.codec_seconds += t_codec + time.perf_counter() - t0
    return target
