"""Rank side of tests/test_compression_fixtures.py: one fixed sequence of compressed
calls on a fresh communicator, each result recorded by its bytes' SHA-256 and first
values. The sequence fixes every seed (the call numbers, the ranks, the chunks), so
the results are a function of the code alone: the fixtures hold today's bits."""

from __future__ import annotations

import hashlib

import numpy as np
from _compression_rank import CODECS, DTYPES, contribution

from ringreduce.compression import ErrorFeedback, configure, settings

N = 4099  # prime: no block (512) or world size divides it
FEEDBACK_N = 3000
PIECES_N = 5003


def _record(out: list, label: str, result) -> None:
    a = np.ascontiguousarray(result)
    out.append(
        {
            "call": label,
            "sha256": hashlib.sha256(a.view(np.uint8).tobytes()).hexdigest(),
            "head": [float(v) for v in a.astype(np.float64).ravel()[:3]],
        }
    )


def _pieces(comm, codec: str) -> int:
    """The pieces the engine's compressed calls of ``codec`` ran in so far."""
    return int(comm._core.stats()["engine_codecs"].get(codec, {}).get("pieces", 0))


def fixed_sequence(comm, pieces: str = "always") -> list:
    """Every codec x dtype: all_reduce (sum; avg queued), reduce_scatter; error feedback
    over three calls and the residual it leaves; then calls cut into pieces of 512
    values per chunk (``pieces="never"``: the same calls whole), with the number of
    engine collectives each all_reduce took ("ops": one) and the pieces it ran in
    ("cut")."""
    out: list = []
    for codec in CODECS:
        for dtype in DTYPES:
            x = contribution(comm.rank, N, dtype)
            _record(out, f"{codec} {dtype} all_reduce sum", comm.all_reduce(x, compression=codec))
            work = comm.all_reduce(x, "avg", compression=codec, async_op=True)
            _record(out, f"{codec} {dtype} all_reduce avg async", work.wait())
            _record(
                out, f"{codec} {dtype} reduce_scatter", comm.reduce_scatter(x, compression=codec)
            )
    for codec in ("bf16", "int8", "int4"):
        ef = ErrorFeedback().key(codec)
        x = contribution(comm.rank, FEEDBACK_N, "float32")
        for i in range(3):
            y = comm.all_reduce(x, compression=codec, error_feedback=ef)
            _record(out, f"{codec} feedback call {i}", y)
        _record(out, f"{codec} feedback residual", ef.residual(FEEDBACK_N))
    old = settings().piece_values, settings().pieces
    configure(piece_values=512, pieces=pieces)
    try:
        for codec in CODECS:
            x = contribution(comm.rank, PIECES_N, "float32")
            ops, cut = comm.stats()["ops"], _pieces(comm, codec)
            _record(out, f"{codec} pieces all_reduce", comm.all_reduce(x, compression=codec))
            _record(out, f"{codec} pieces ops", np.array([comm.stats()["ops"] - ops]))
            _record(out, f"{codec} pieces cut", np.array([_pieces(comm, codec) - cut]))
            _record(
                out, f"{codec} pieces reduce_scatter", comm.reduce_scatter(x, compression=codec)
            )
    finally:
        configure(piece_values=old[0], pieces=old[1])
    return out
