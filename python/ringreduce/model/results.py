"""What the model answers with: phases of a collective, a prediction, the choice of an
algorithm, and a training step's estimate."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping

if TYPE_CHECKING:
    from .cost import CostModel


@dataclass(frozen=True)
class Phase:
    """One part of a collective: ``steps`` dependent latencies and ``wire_bytes`` per
    direction on ``link`` (its slowest link), and ``reduce_bytes`` reduced by one rank."""

    name: str
    link: str
    steps: float
    wire_bytes: float
    reduce_bytes: float = 0.0

    def seconds(self, model: CostModel) -> float:
        """This phase's time under ``model``'s parameters."""
        link = model.link(self.link)
        return (
            self.steps * link.alpha + self.wire_bytes * link.beta + self.reduce_bytes * model.gamma
        )


@dataclass(frozen=True)
class Prediction:
    """The predicted time of one call: ``seconds``, and the phases it is the sum of."""

    collective: str
    algorithm: str
    nbytes: float
    ranks: int
    seconds: float
    phases: tuple[Phase, ...]
    sent_bytes: float  # bytes one rank sends, over all its links

    @property
    def algbw(self) -> float:
        """nbytes / seconds, GB/s (nccl-tests' algbw)."""
        return self.nbytes / self.seconds / 1e9 if self.seconds > 0 else math.inf

    @property
    def busbw(self) -> float:
        """Bytes one rank sends per second, GB/s: for a ring all_reduce
        ``algbw x 2(N-1)/N``, nccl-tests' busbw."""
        return self.sent_bytes / self.seconds / 1e9 if self.seconds > 0 else math.inf


@dataclass(frozen=True)
class Choice:
    """Which all_reduce algorithm runs at a size (``engine``: the engine's rule as built)
    and which the model predicts fastest (``fastest``), with every candidate's time and a
    sentence saying why."""

    nbytes: float
    engine: str
    fastest: str
    seconds: Mapping[str, float]
    reason: str


@dataclass(frozen=True)
class StepEstimate:
    """A data-parallel training step: ``compute_s`` plus the gradients' all_reduce.

    ``comm_s`` is the model's all_reduce of all gradients at once and ``rounded_comm_s``
    the back-of-envelope figure with 2(N-1)/N rounded up to 2: 2 x S bytes at the link's
    bandwidth, no latency.
    ``exposed_s`` is what stays on the step when buckets are reduced while backward
    runs: at least the last bucket (the first layers' gradients are ready last), more if
    the buckets take longer than backward.
    """

    grad_bytes: float
    compute_s: float
    backward_s: float
    ring_factor: float  # 2(N-1)/N
    link: str
    comm_s: float
    rounded_comm_s: float
    bucketed_comm_s: float
    last_bucket_s: float
    exposed_s: float
    rounded_exposed_s: float

    @property
    def fraction(self) -> float:
        """Communication's share of a step without overlap."""
        return self.comm_s / (self.compute_s + self.comm_s)

    @property
    def rounded_fraction(self) -> float:
        """The rounded figure's share: 2 x S at link bandwidth against compute."""
        return self.rounded_comm_s / (self.compute_s + self.rounded_comm_s)

    @property
    def overlap_fraction(self) -> float:
        """Communication's exposed share of a step overlapped with backward."""
        return self.exposed_s / (self.compute_s + self.exposed_s)

    @property
    def rounded_overlap_fraction(self) -> float:
        """The rounded figure (2 x S at link bandwidth), overlapped with backward."""
        return self.rounded_exposed_s / (self.compute_s + self.rounded_exposed_s)
