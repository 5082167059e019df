"""The ring's pure arithmetic, tested without any I/O."""

from __future__ import annotations

import pytest

import ringreduce as rr
from ringreduce import _core


@pytest.mark.parametrize("n", [0, 1, 2, 7, 8, 9, 1000, 1001])
@pytest.mark.parametrize("parts", [1, 2, 3, 4, 5, 8])
def test_chunk_bounds_are_balanced_and_cover_everything(n, parts):
    bounds = [rr.chunk_bounds(n, parts, r) for r in range(parts)]
    assert bounds[0][0] == 0 and bounds[-1][1] == n
    for (_, stop), (start, _) in zip(bounds, bounds[1:]):
        assert stop == start
    sizes = [stop - start for start, stop in bounds]
    # The first n % parts ranks get one extra element.
    assert sizes == [n // parts + (1 if r < n % parts else 0) for r in range(parts)]


def test_chunk_bounds_rejects_bad_arguments():
    with pytest.raises(ValueError):
        rr.chunk_bounds(10, 0, 0)
    with pytest.raises(ValueError):
        rr.chunk_bounds(10, 4, 4)


@pytest.mark.parametrize("size", [2, 3, 4, 5, 8])
def test_reduce_scatter_schedule_leaves_rank_r_with_chunk_r(size):
    # Simulate the schedule symbolically: each rank holds, per chunk, the set of
    # ranks whose contribution has been summed into its copy.
    held = [[{r} for _ in range(size)] for r in range(size)]
    for step in range(size - 1):
        sent = {}
        for r in range(size):
            send_chunk, _ = _core.testing.reduce_scatter_step(r, size, step)
            sent[(r + 1) % size] = (send_chunk, set(held[r][send_chunk]))
        for r in range(size):
            chunk, contributions = sent[r]
            _, recv_chunk = _core.testing.reduce_scatter_step(r, size, step)
            assert chunk == recv_chunk, "the receiver expects the chunk its neighbour sends"
            assert not held[r][chunk] & contributions, "no contribution is counted twice"
            held[r][chunk] |= contributions
    for r in range(size):
        assert held[r][r] == set(range(size))


@pytest.mark.parametrize("size", [2, 3, 4, 5, 8])
def test_all_gather_schedule_delivers_every_chunk_once(size):
    have = [{r} for r in range(size)]
    for step in range(size - 1):
        sent = {}
        for r in range(size):
            send_chunk, _ = _core.testing.all_gather_step(r, size, step)
            assert send_chunk in have[r], "a rank only forwards chunks it has"
            sent[(r + 1) % size] = send_chunk
        for r in range(size):
            _, recv_chunk = _core.testing.all_gather_step(r, size, step)
            assert sent[r] == recv_chunk and recv_chunk not in have[r]
            have[r].add(recv_chunk)
    assert all(h == set(range(size)) for h in have)
