"""Compressed calls run in pieces (`compressed_pieces`): each piece encoded while the
one before travels, in the engine's one-hop schedule (csrc/algorithms/one_hop.h) and on
the Python path. The cut itself; the Python path's choice, measured per codec and size
class and the same on every rank; results within each codec's bound, bitwise the same on
every rank, in place or not, blocking or queued; error feedback still makes averages
converge; ranks that disagree raise before any row travels."""

from __future__ import annotations

import time

import _compression_rank as cr
import numpy as np
import pytest
from test_compression import _bounds, _reference

from ringreduce import _core
from ringreduce._comm.compressed.pieces import (
    MAX_PIECES,
    THRESHOLD,
    PieceChoice,
    host_idle_seconds,
    pieces,
)
from ringreduce.compression import BLOCK, configure, settings
from ringreduce.compression.policy import Settings

from _ranks import run_ranks


@pytest.mark.parametrize("n, size", [(1, 1), (4099, 3), (12297, 3), (1 << 20, 4), (5 * BLOCK, 7)])
@pytest.mark.parametrize("piece_values", [0, BLOCK, 3 * BLOCK, 1000])
def test_pieces_cover_every_chunk_in_block_aligned_steps(n, size, piece_values):
    bounds = [_core.chunk_bounds(n, size, k) for k in range(size)]
    parts = pieces(bounds, piece_values)
    longest = max(hi - lo for lo, hi in bounds)
    whole = piece_values == 0 or longest < 2 * piece_values
    assert (len(parts) == 1) == whole and len(parts) <= MAX_PIECES
    if whole:
        assert parts == [bounds]
        return
    for k, (lo, hi) in enumerate(bounds):
        cuts = [part[k] for part in parts]
        assert cuts[0][0] == lo and cuts[-1][1] == hi
        for (a, b), (c, _) in zip(cuts, cuts[1:]):
            assert b == c and a <= b  # in order, nothing left out or read twice
        for _, b in cuts[:-1]:
            if b < hi:
                assert (b - lo) % BLOCK == 0  # a piece's blocks are the chunk's blocks


def test_piece_settings_are_checked():
    with pytest.raises(ValueError, match="piece_values must be >= 0"):
        configure(piece_values=-1)
    with pytest.raises(ValueError, match="pieces must be 'auto', 'always' or 'never'"):
        configure(pieces="sometimes")
    assert settings().piece_values == 1 << 16 and settings().pieces == "auto"


class _Comm:
    def __init__(self, world_size=4, transport="tcp"):
        self.world_size, self.transport = world_size, transport


def test_plan_runs_whole_measures_once_then_follows_the_choice():
    big = 4 * 2 * 1000  # chunks of 2000 values: twice piece_values=1000
    on = Settings(piece_values=1000)
    choice = PieceChoice()
    assert choice.plan(_Comm(), "int8", big - 4, on) == (0, None)  # chunks too short
    assert choice.plan(_Comm(transport="shm"), "int8", big, on) == (0, None)
    assert choice.plan(_Comm(world_size=1), "int8", big, on) == (0, None)
    assert choice.plan(_Comm(), "int8", big, Settings(piece_values=0)) == (0, None)
    never = Settings(piece_values=1000, pieces="never")
    always = Settings(piece_values=1000, pieces="always")
    assert choice.plan(_Comm(), "int8", big, never) == (0, None)
    assert choice.plan(_Comm(), "int8", big, always) == (1000, None)
    key = ("int8", big.bit_length())
    assert choice.plan(_Comm(), "int8", big, on) == (0, key)  # first: whole, measured
    choice.ratios[key] = THRESHOLD  # measured: pieces pay
    assert choice.plan(_Comm(), "int8", big, on) == (1000, None)
    assert choice.plan(_Comm(), "int8", 2 * big, on) == (0, ("int8", key[1] + 1))  # a class
    assert choice.plan(_Comm(), "bf16", big, on) == (0, ("bf16", key[1]))  # and a codec
    choice.ratios[key] = THRESHOLD / 2  # measured: they do not
    assert choice.plan(_Comm(), "int8", big, on) == (0, None)


def test_host_idle_seconds_counts_up_where_the_host_says():
    first = host_idle_seconds()
    if first is None:
        pytest.skip("no /proc/stat here: the process's own waiting stands in")
    time.sleep(0.05)
    assert first > 0 and host_idle_seconds() >= first


def test_calls_in_pieces_are_within_bound_and_identical(group_factory):
    """3 ranks; chunks of up to 4099 values cut for pieces of 512 values."""
    n_ranks, sizes, calls = 3, (1, 4099, 3 * 4099), 32
    results = group_factory(n_ranks).run(cr.in_pieces, BLOCK, sizes, calls)
    got0 = results[0][0]
    for (codec, dtype, n), (y, _, inplace, ops, later) in got0.items():
        parts, exact = _reference(n_ranks, n, dtype)
        rs_bound, ar_bound = _bounds(codec, dtype, parts, exact)
        err = np.abs(y.astype(np.float64) - exact)
        assert (err <= ar_bound).all(), (codec, dtype, n, float((err - ar_bound).max()))
        blocks = np.concatenate([r[0][codec, dtype, n][1] for r in results]).astype(np.float64)
        assert (np.abs(blocks - exact) <= rs_bound).all(), (codec, dtype, n, "reduce_scatter")
        # In place, every piece of x is read before the same piece of the result is
        # written: the same bits as out of place (the call numbers differ, so only the
        # deterministic codec can be compared bit for bit).
        if codec in ("bf16", "fp16"):
            assert inplace.tobytes() == y.tobytes(), (codec, dtype, n)
        chunk = -(-n // n_ranks)
        expect = len(pieces([(0, chunk)], BLOCK))  # the engine cuts as the Python path
        assert ops == (1, expect), (codec, dtype, n, ops)  # one engine collective, in pieces
        for r in range(1, n_ranks):
            mine = results[r][0][codec, dtype, n]
            assert mine[0].tobytes() == y.tobytes(), (codec, dtype, n, r)
            assert mine[2].tobytes() == inplace.tobytes(), (codec, dtype, n, r)
            assert mine[4].tobytes() == later.tobytes(), (codec, dtype, n, r)
    # Chunks of 4099 values: 5 pieces of 1024 (2 BLOCKs; 512 would make more than 8).
    assert got0["int8", "float32", 3 * 4099][3] == (1, 5)
    # Error feedback over pieces: the average of 32 int4 calls errs as the last residuals
    # / 32, where without feedback stochastic rounding shrinks only as 1/sqrt(32).
    _, exact = _reference(n_ranks, sizes[-1], "float32")
    one = got0["int4", "float32", sizes[-1]][0].astype(np.float64)
    single = np.linalg.norm(one - exact)
    fed, plain = (np.linalg.norm(t / calls - exact) for t in results[0][1])
    assert fed < 4.0 * single / calls, (single, fed)
    assert plain > 2.0 * fed, (plain, fed)
    for r in range(1, n_ranks):
        for mine, first in zip(results[r][1], results[0][1]):
            assert mine.tobytes() == first.tobytes()


def test_calls_over_shared_memory_run_whole(group_factory):
    """One host over shared memory: the exchanges are the same cores' copies, so calls
    run whole (measured slower in pieces, docs/compression.md)."""
    results = group_factory(2, transport="shm").run(cr.in_pieces, BLOCK, (2 * 4099,), 1)
    for got, _ in results:
        assert {ops for (_, _, _, ops, _) in got.values()} == {(1, 1)}


def test_ranks_whose_counts_cut_differently_all_raise_naming_both_calls():
    """The engine's call header carries the count and the pieces: every rank raises
    before any row travels, naming both calls, as an exact call's ranks do; the
    communicator is then broken, as after any collective whose ranks disagree (so a
    fresh one, not a kept group)."""
    outcomes = run_ranks(2, cr.mismatch_in_pieces)
    assert all(status == "ok" for status, _, _ in outcomes), outcomes
    for (kind, text), (later, why) in (value for _, value, _ in outcomes):
        assert kind == "MismatchError" and "1024" in text and "4096" in text, (kind, text)
        assert "compression=int8" in text and "in 4 pieces" in text, text
        assert later != "none" and "collective mismatch" in why, (later, why)


def test_auto_measures_each_size_class_once_and_every_rank_follows_one_choice(group_factory):
    """The first call of a size class runs whole (2 collectives) plus the agreement (1);
    later calls all run whole or all in pieces, with the same choice on every rank."""
    sizes, calls = (3 * 4099, 3 * 2048 * 3), 3

    def cut_of(n):
        return 2 * len(pieces([(0, -(-n // 3))], 512))

    results = group_factory(3).run(cr.pieces_chosen, sizes, calls)
    for n in sizes:
        ops, ratio, ys, lane = results[0][n]
        assert lane[0] == 3 and lane[1] in (2, cut_of(n)), (n, lane)
        assert ops[0] == 3 and ratio is not None and ratio >= 0.0, (n, ops, ratio)
        whole, cut = 2, cut_of(n)
        assert all(o == (cut if ratio >= THRESHOLD else whole) for o in ops[1:]), (n, ops, ratio)
        for r in range(1, 3):
            assert results[r][n][:2] == (ops, ratio) and results[r][n][3] == lane, (n, r)
            for mine, first in zip(results[r][n][2], ys):
                assert mine.tobytes() == first.tobytes(), (n, r)
