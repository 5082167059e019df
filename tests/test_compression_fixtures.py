"""Compressed collectives give the bits they gave when the fixtures were recorded
(tests/fixtures/compressed_outputs.json): every codec x dtype, all_reduce (blocking and
queued, sum and avg), reduce_scatter, error feedback over three calls and its residual,
and calls cut into pieces, at 2 and 3 ranks over TCP, on a fresh communicator each.

The codec kernels are bit-identical to the numpy reference on every instruction set
(tests/test_codec_kernels.py), so these bits depend on the code alone. A change to how
compressed calls are scheduled (pieces, pipelining, a collective of the engine's own)
must keep them; a change that means to alter them (a new rounding, a new seed) records
them again, and says so:

    python tests/test_compression_fixtures.py --write
"""

from __future__ import annotations

import json
import os
import sys

import pytest

pytest.importorskip("ml_dtypes")

import _compression_fixture_rank as fr  # noqa: E402

from _ranks import run_ranks  # noqa: E402

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "compressed_outputs.json")
WORLDS = (2, 3)


def _record(n: int, pieces: str = "always") -> list:
    """Each rank's calls, in order, on a fresh communicator of n ranks over TCP."""
    outcomes = run_ranks(n, fr.fixed_sequence, pieces, transport="tcp", timeout=240)
    for rank, (status, _, tb) in enumerate(outcomes):
        assert status == "ok", f"rank {rank}: {tb}"
    return [value for _, value, _ in outcomes]


@pytest.mark.parametrize("n", WORLDS)
def test_compressed_calls_keep_their_recorded_bits(n):
    with open(FIXTURES) as f:
        expected = json.load(f)[str(n)]
    got = _record(n)
    for rank, (mine, theirs) in enumerate(zip(got, expected)):
        assert [c["call"] for c in mine] == [c["call"] for c in theirs], f"rank {rank}"
        changed = [
            f"{new['call']}: first values {new['head']}, recorded {old['head']}"
            for new, old in zip(mine, theirs)
            if new["sha256"] != old["sha256"]
        ]
        assert not changed, f"rank {rank} of {n}: bits differ from the fixtures: {changed[:5]}"


def test_calls_in_pieces_give_the_bits_of_the_calls_whole():
    """The built-in codecs encode a piece at its index in the chunk, with the chunk's
    seed (stochastic rounding's dither is a hash of the element's index): the same
    calls in pieces and whole, on fresh communicators, give the same bits."""
    cut, whole = _record(3, "always"), _record(3, "never")
    for rank, (mine, theirs) in enumerate(zip(cut, whole)):
        counts = {c["call"]: c["head"][0] for c in mine if c["call"].endswith((" ops", " cut"))}
        whole_counts = {
            c["call"]: c["head"][0] for c in theirs if c["call"].endswith((" ops", " cut"))
        }
        # One engine collective per call, cut or whole; really cut: 2 pieces of each
        # 1668-value chunk.
        for codec in ("bf16", "fp16", "int8", "int4"):
            assert counts[f"{codec} pieces ops"] == whole_counts[f"{codec} pieces ops"] == 1.0
            assert counts[f"{codec} pieces cut"] == 2.0, counts
            assert whole_counts[f"{codec} pieces cut"] == 1.0, whole_counts
        changed = [
            new["call"]
            for new, old in zip(mine, theirs)
            if new["sha256"] != old["sha256"] and not new["call"].endswith((" ops", " cut"))
        ]
        assert not changed, f"rank {rank}: in pieces, the bits differ: {changed}"


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(__doc__)
    sys.path.insert(0, os.path.dirname(__file__))
    data = {str(n): _record(n) for n in WORLDS}
    with open(FIXTURES, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    print(f"wrote {FIXTURES}: {sum(len(r) for v in data.values() for r in v)} results")
