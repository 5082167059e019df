"""An alpha-beta cost model of ringreduce's collectives, its algorithms and a training step.

Every collective is a sequence of *phases*. A phase takes some dependent *steps* (each
costs the link's latency ``alpha``: a step cannot start before the previous one's
message has arrived), moves some bytes over its slowest link, per direction (each costs
the link's ``beta``, seconds per byte = 1 / bandwidth) and reduces some bytes on one
rank (each costs ``gamma`` = 1 / reduction throughput)::

    time = sum over phases of  steps x alpha + wire bytes x beta + reduced bytes x gamma

The phases follow the engine's schedules (``csrc/algorithms``), not textbook ones:

==================  ================================================================
all_reduce  ring    reduce-scatter then all-gather, N-1 steps each of S/N: every rank
                    sends 2(N-1)/N x S, whatever N (the bandwidth-optimal count).
all_reduce  small   all-gather of every rank's whole vector around the ring (N-1 steps
                    of S), then N-1 local reductions; for small S only.
all_reduce  direct  every rank sends S to every other at once (one step): where the
                    transport reaches every peer (shared memory, MPI, 2 ranks).
all_reduce  hier.   reduce-scatter on each host, one cross-host ring all-reduce per
                    local rank (all of a host's ranks share its network link), all-gather
                    on each host; cross-host bytes per host 2(H-1)/H x S.
reduce_scatter      the ring's reduce-scatter, run once per piece of 4 segments (so
                    ceil(S/N / piece) x (N-1) steps): (N-1)/N x S sent per rank.
all_gather          the ring's all-gather: N-1 steps of the block.
broadcast           a segment-pipelined chain from the root: N-1 step latencies, then
                    S plus N-2 segments through the slowest link.
reduce              reduce_scatter, then every rank sends its chunk to the root (one step).
gather / scatter    every rank's block to / from the root, all at once (one step).
all_to_all          block p of every rank to rank p, all at once (one step).
barrier             N-1 one-byte token rounds (the call header is the first).
==================  ================================================================

Every call with more than one rank first swaps a call header with its ring neighbours
(one more step). ``nbytes`` is always the size of the array a rank passes (the root's
for scatter). Ranks sit on ``hosts`` hosts, ``ranks_per_host`` each; hops on a host use
``intra_link``, hops between hosts ``inter_link``, and the ring visits hosts in order, so
a flat ring crosses each host's network link once per direction.

Example (the design's worked example: a 7B model's fp16 gradients over 8 ranks)::

    >>> from ringreduce.model import CostModel, Link
    >>> m = CostModel(hosts=8, links={"tcp": Link.from_gbps(800)})
    >>> round(m.predict("all_reduce", 14e9).seconds, 3)
    0.245
"""

from .cost import CostModel
from .fitting import Sample, fit
from .link import (
    ALGORITHMS,
    COLLECTIVES,
    DEFAULT_LINKS,
    DEFAULT_SEGMENT_BYTES,
    DEFAULT_SMALL_BYTES,
    Link,
    itemsize,
)
from .results import Choice, Phase, Prediction, StepEstimate

__all__ = [
    "ALGORITHMS",
    "COLLECTIVES",
    "DEFAULT_LINKS",
    "DEFAULT_SEGMENT_BYTES",
    "DEFAULT_SMALL_BYTES",
    "Choice",
    "CostModel",
    "Link",
    "Phase",
    "Prediction",
    "Sample",
    "StepEstimate",
    "fit",
    "itemsize",
]
