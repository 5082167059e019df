"""CostModel: the alpha-beta-gamma time of every collective and algorithm, the engine's
choice among them, and a training step with bucketed gradients."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Mapping, Optional, Sequence

from .. import _core
from .link import (
    _PIECE_SEGMENTS,
    ALGORITHMS,
    COLLECTIVES,
    DEFAULT_LINKS,
    DEFAULT_SEGMENT_BYTES,
    DEFAULT_SMALL_BYTES,
    Link,
    itemsize,
)
from .results import Choice, Phase, Prediction, StepEstimate


@dataclass(frozen=True)
class CostModel:
    """Ranks, their links and the reduction rate; predicts collectives and steps.

    Args:
        hosts, ranks_per_host: the job's shape (N = hosts x ranks_per_host).
        links: alpha/beta per link kind ("shm", "tcp", "mpi"); kinds not given take
            ``DEFAULT_LINKS``.
        intra_link, inter_link: the kinds of the hops on a host and between hosts.
        reduce_gbs: reduction throughput of one rank, GB/s of output; None: free (as on
            a GPU, and in the rounded 2 x S figure).
        segment_bytes, small_bytes: the engine's RINGREDUCE_SEGMENT_BYTES and
            RINGREDUCE_SMALL_BYTES.
        reaches_all: whether the transport reaches every peer directly (then small
            all_reduces go "direct", else "small"); None derives it as the engine does.
    """

    hosts: int = 1
    ranks_per_host: int = 1
    links: Mapping[str, Link] = field(default_factory=dict)
    intra_link: str = "shm"
    inter_link: str = "tcp"
    reduce_gbs: Optional[float] = None
    segment_bytes: int = DEFAULT_SEGMENT_BYTES
    small_bytes: int = DEFAULT_SMALL_BYTES
    reaches_all: Optional[bool] = None

    def __post_init__(self) -> None:
        if self.hosts < 1 or self.ranks_per_host < 1:
            raise ValueError(
                f"hosts and ranks_per_host must be >= 1, got {self.hosts}, {self.ranks_per_host}"
            )
        if self.small_bytes < 0:
            raise ValueError(f"small_bytes must be >= 0, got {self.small_bytes}")
        if self.reduce_gbs is not None and not self.reduce_gbs > 0:
            raise ValueError(f"reduce_gbs must be positive or None, got {self.reduce_gbs}")

    # -- parameters -----------------------------------------------------------------
    @property
    def ranks(self) -> int:
        """N, the number of ranks."""
        return self.hosts * self.ranks_per_host

    @property
    def gamma(self) -> float:
        """Seconds per byte reduced (0 when the reduction is free)."""
        return 0.0 if self.reduce_gbs is None else 1.0 / (self.reduce_gbs * 1e9)

    def link(self, kind: str) -> Link:
        """The parameters of link kind ``kind`` (given, else assumed)."""
        if kind in self.links:
            return self.links[kind]
        if kind in DEFAULT_LINKS:
            return DEFAULT_LINKS[kind]
        raise ValueError(f"no parameters for link kind {kind!r}")

    def link_kinds(self) -> tuple[str, ...]:
        """The kinds of link this job's rings use."""
        kinds = []
        if self.ranks_per_host > 1:
            kinds.append(self.intra_link)
        if self.hosts > 1 and self.inter_link not in kinds:
            kinds.append(self.inter_link)
        return tuple(kinds) or (self.intra_link,)

    def small_limit(self) -> int:
        """all_reduce sizes up to this take a latency path: small_bytes x 2 / N (0 at one
        rank), as the engine computes it."""
        return _core.small_message_bytes(self.small_bytes, self.ranks)

    def reaches_every_peer(self) -> bool:
        """Whether every peer is reached directly: shared memory and MPI reach all, TCP
        only the ring neighbours (both ways only at 2 ranks)."""
        if self.reaches_all is not None:
            return self.reaches_all
        return self.ranks == 2 or "tcp" not in self.link_kinds()

    # -- phases ---------------------------------------------------------------------
    def _slowest(
        self, name: str, options: Sequence[tuple[str, float, float]], reduce: float = 0.0
    ) -> Phase:
        """Of simultaneous transfers (link, steps, wire bytes), the one that takes longest."""
        phases = [Phase(name, k, s, w, reduce) for k, s, w in options if s > 0 or w > 0]
        if not phases:
            return Phase(name, self.link_kinds()[0], 0.0, 0.0, reduce)
        return max(phases, key=lambda p: p.seconds(self))

    def _ring(self, name: str, steps: float, wire: float, reduce: float = 0.0) -> Phase:
        """A phase around the flat ring: every hop busy at once, the slowest sets the pace."""
        return self._slowest(name, [(k, steps, wire) for k in self.link_kinds()], reduce)

    def _fanout(self, name: str, block: float, reduce: float = 0.0) -> Phase:
        """One step in which every rank sends ``block`` to every other rank at once: a host's
        network link carries its L ranks' blocks to the N-L ranks elsewhere."""
        n, local = self.ranks, self.ranks_per_host
        return self._slowest(
            name,
            [
                (self.intra_link, 1, (local - 1) * block),
                (self.inter_link, 1 if self.hosts > 1 else 0, local * (n - local) * block),
            ],
            reduce,
        )

    def _rooted(self, name: str, block: float) -> Phase:
        """One step in which the root exchanges ``block`` with every other rank at once."""
        n, local = self.ranks, self.ranks_per_host
        return self._slowest(
            name,
            [
                (self.intra_link, 1, (local - 1) * block),
                (self.inter_link, 1 if self.hosts > 1 else 0, (n - local) * block),
            ],
        )

    def _rounds(self, nbytes: float, elem: int) -> int:
        """reduce_scatter's rounds: pieces of 4 segments of the largest chunk."""
        count = int(nbytes) // elem
        largest = -(-count // self.ranks)
        piece = _PIECE_SEGMENTS * max(1, self.segment_bytes // elem)
        return max(1, -(-largest // piece))

    def phases(
        self, collective: str, nbytes: float, algorithm: Optional[str] = None, elem: int = 4
    ) -> tuple[list[Phase], str, float]:
        """(phases, algorithm, bytes one rank sends) of one call; see :meth:`predict`."""
        n, s = self.ranks, float(nbytes)
        if collective not in COLLECTIVES:
            raise ValueError(f"collective: one of {', '.join(COLLECTIVES)}, got {collective!r}")
        if collective == "all_reduce":
            algorithm = algorithm or self.engine_algorithm(s)
            if algorithm not in ALGORITHMS:
                raise ValueError(f"algorithm: one of {', '.join(ALGORITHMS)}, got {algorithm!r}")
        elif algorithm not in (None, "ring" if collective != "all_to_all" else "direct"):
            raise ValueError(f"{collective} has one algorithm; got {algorithm!r}")
        algorithm = algorithm or {
            "gather": "direct",
            "scatter": "direct",
            "all_to_all": "direct",
        }.get(collective, "ring")
        if n == 1 or (s <= 0 and collective != "barrier"):
            return [], algorithm, 0.0  # a local copy at most
        header = self._ring("call header", 1, 0)
        chunk = s / n
        if collective == "all_reduce":
            if algorithm == "ring":
                return (
                    [
                        header,
                        self._ring("reduce-scatter", n - 1, (n - 1) * chunk, (n - 1) * chunk),
                        self._ring("all-gather", n - 1, (n - 1) * chunk),
                    ],
                    algorithm,
                    2 * (n - 1) * chunk,
                )
            if algorithm == "small":
                return (
                    [header, self._ring("all-gather of S", n - 1, (n - 1) * s, (n - 1) * s)],
                    algorithm,
                    (n - 1) * s,
                )
            if algorithm == "direct":
                return (
                    [header, self._fanout("S to every peer", s, (n - 1) * s)],
                    algorithm,
                    (n - 1) * s,
                )
            return self._hierarchical(s, header)
        if collective == "reduce_scatter":
            rounds = self._rounds(s, elem)
            rs = self._ring("reduce-scatter", rounds * (n - 1), (n - 1) * chunk, (n - 1) * chunk)
            return [header, rs], algorithm, (n - 1) * chunk
        if collective == "all_gather":
            return [header, self._ring("all-gather", n - 1, (n - 1) * s)], algorithm, (n - 1) * s
        if collective == "broadcast":
            segment = min(float(self.segment_bytes), s)
            return [header, self._ring("pipeline", n - 1, s + (n - 2) * segment)], algorithm, s
        if collective == "reduce":
            rounds = self._rounds(s, elem)
            rs = self._ring("reduce-scatter", rounds * (n - 1), (n - 1) * chunk, (n - 1) * chunk)
            return [header, rs, self._rooted("chunks to root", chunk)], algorithm, n * chunk
        if collective == "gather":
            return [header, self._rooted("blocks to root", s)], algorithm, s
        if collective == "scatter":
            return [header, self._rooted("blocks from root", chunk)], algorithm, (n - 1) * chunk
        if collective == "all_to_all":
            return [header, self._fanout("block to every peer", chunk)], algorithm, (n - 1) * chunk
        return [self._ring("token rounds", n - 1, 0)], algorithm, 0.0  # barrier

    def _hierarchical(self, s: float, header: Phase) -> tuple[list[Phase], str, float]:
        hosts, local = self.hosts, self.ranks_per_host
        if hosts == 1 or local == 1:
            raise ValueError("hierarchical all_reduce needs several hosts of several ranks")
        shard = s / local
        on_host = (local - 1) * shard
        # The L cross-host rings run at once and share the host's network link, which so
        # carries every local rank's bytes: 2(H-1)/H x S per host in all.
        cross = 2 * (hosts - 1) * s / hosts
        return (
            [
                header,
                Phase("reduce-scatter on host", self.intra_link, local - 1, on_host, on_host),
                Phase(
                    "all-reduce across hosts",
                    self.inter_link,
                    2 * (hosts - 1),
                    cross,
                    (hosts - 1) * shard / hosts,
                ),
                Phase("all-gather on host", self.intra_link, local - 1, on_host),
            ],
            "hierarchical",
            2 * on_host + cross / local,
        )

    # -- predictions ----------------------------------------------------------------
    def predict(
        self,
        collective: str,
        nbytes: float,
        algorithm: Optional[str] = None,
        dtype: str = "float32",
    ) -> Prediction:
        """The predicted time of one call of ``collective`` on arrays of ``nbytes``.

        Args:
            collective: one of :data:`COLLECTIVES`.
            nbytes: the size of the array each rank passes (the root's for scatter).
            algorithm: all_reduce only: "ring", "small", "direct" or "hierarchical";
                None takes the engine's rule (:meth:`engine_algorithm`).
            dtype: sets the element size (reduce_scatter's pieces are whole elements).
        """
        phases, algorithm, sent = self.phases(collective, nbytes, algorithm, itemsize(dtype))
        seconds = sum(p.seconds(self) for p in phases)
        return Prediction(
            collective, algorithm, float(nbytes), self.ranks, seconds, tuple(phases), sent
        )

    def engine_algorithm(self, nbytes: float) -> str:
        """The all_reduce algorithm the engine runs at ``nbytes`` with
        RINGREDUCE_ALGORITHM=auto: the engine's own rule (choose_algorithm in
        csrc/algorithms/collective.cc, asked through ``_core.engine_algorithm``), a
        latency path up to :meth:`small_limit`; above it the hierarchical all_reduce
        where there are several hosts with several ranks each, else the ring."""
        return self._engine(nbytes, "auto")

    def _engine(self, nbytes: float, policy: str, small_bytes: Optional[int] = None) -> str:
        """The engine's choice at ``nbytes`` under RINGREDUCE_ALGORITHM=``policy`` (and
        RINGREDUCE_SMALL_BYTES=``small_bytes``, default the model's)."""
        options = _core.Options()
        options.small_bytes = self.small_bytes if small_bytes is None else small_bytes
        options.segment_bytes = self.segment_bytes
        options.algorithm = policy
        # The engine counts whole bytes: a fraction of one more is one more.
        top = 1 << 62
        whole = 0 if not nbytes > 0 else top if nbytes >= top else math.ceil(nbytes)
        return _core.engine_algorithm(
            _core.Collective.ALL_REDUCE,
            whole,
            self.ranks,
            self.ranks_per_host,
            self.reaches_every_peer(),
            options,
        )

    def candidates(self) -> tuple[str, ...]:
        """The all_reduce algorithms that can run on this job's shape and links."""
        # The latency path these links take, as the engine names it: its choice for one
        # byte under a small-message limit that admits it.
        out = ["ring", self._engine(1, "auto", small_bytes=1 << 20)]
        if self._engine(math.inf, "hierarchical") == "hierarchical":  # where it can run
            out.append("hierarchical")
        return tuple(dict.fromkeys(out))

    def choose(self, nbytes: float) -> Choice:
        """The all_reduce algorithm for ``nbytes``: the engine's rule, the model's fastest,
        and why."""
        times = {a: self.predict("all_reduce", nbytes, a).seconds for a in self.candidates()}
        engine = self.engine_algorithm(nbytes)
        fastest = min(times, key=lambda a: (times[a], a != engine))
        limit = self.small_limit()
        if engine == "ring":
            rule = f"{_size(nbytes)} > {_size(limit)} (small_bytes x 2/N): ring"
        elif engine == "hierarchical":
            rule = (
                f"{_size(nbytes)} > {_size(limit)} (small_bytes x 2/N), {self.hosts} hosts x "
                f"{self.ranks_per_host} ranks: hierarchical"
            )
        else:
            way = "every peer reached directly" if engine == "direct" else "ring neighbours only"
            rule = f"{_size(nbytes)} <= {_size(limit)} (small_bytes x 2/N), {way}: {engine}"
        ranked = ", ".join(f"{a} {_time(t)}" for a, t in sorted(times.items(), key=lambda x: x[1]))
        best = self.predict("all_reduce", nbytes, fastest)
        latency = sum(p.steps * self.link(p.link).alpha for p in best.phases)
        bound = "latency" if latency >= best.seconds / 2 else "bandwidth"
        why = {
            ("ring", "bandwidth"): "fewest bytes per rank, 2(N-1)/N x S",
            ("ring", "latency"): "no other path runs here",
            ("small", "latency"): "N-1 steps instead of 2(N-1)",
            ("small", "bandwidth"): "N-1 steps instead of 2(N-1)",
            ("direct", "latency"): "one step instead of 2(N-1)",
            ("direct", "bandwidth"): "one step instead of 2(N-1)",
            ("hierarchical", "latency"): "2(H-1) steps cross hosts, not 2(N-1)",
            ("hierarchical", "bandwidth"): "2(H-1)/H x S cross each host's link, not 2(N-1)/N x S",
        }[fastest, bound]
        return Choice(
            float(nbytes),
            engine,
            fastest,
            times,
            f"engine: {rule}; model: {ranked} ({bound}-bound; {fastest}: {why})",
        )

    def step(
        self,
        grad_bytes: float,
        compute_s: float,
        *,
        backward_fraction: float = 2.0 / 3.0,
        bucket_bytes: float = 25 << 20,
        first_bucket_bytes: float = 1 << 20,
    ) -> StepEstimate:
        """A training step of ``compute_s`` seconds whose gradients (``grad_bytes``) are
        all-reduced, with and without overlapping backward.

        Backward is ``backward_fraction`` of compute (about twice forward). Overlapped, the
        gradients go in buckets as ``GradientBucketer`` makes them (a first bucket of
        ``first_bucket_bytes``, then ``bucket_bytes`` each; defaults as its 1 and 25 MiB),
        each reduced as soon as backward has produced it.
        """
        if compute_s < 0 or not 0 <= backward_fraction <= 1:
            raise ValueError("compute_s must be >= 0 and backward_fraction in [0, 1]")
        backward = compute_s * backward_fraction
        full = self.predict("all_reduce", grad_bytes, self.choose(grad_bytes).fastest)
        buckets = _buckets(grad_bytes, first_bucket_bytes, bucket_bytes)
        times = [self.predict("all_reduce", b, self.choose(b).fastest).seconds for b in buckets]
        bucketed = sum(times)
        last = times[-1] if times else 0.0
        n = self.ranks
        ring_link = self.link(full.phases[-1].link) if full.phases else Link(0.0, 0.0)
        rounded = 2 * grad_bytes * ring_link.beta if n > 1 else 0.0
        rounded_last = 2 * (buckets[-1] if buckets else 0) * ring_link.beta if n > 1 else 0.0
        return StepEstimate(
            grad_bytes=float(grad_bytes),
            compute_s=float(compute_s),
            backward_s=backward,
            ring_factor=2 * (n - 1) / n,
            link=full.phases[-1].link if full.phases else self.intra_link,
            comm_s=full.seconds,
            rounded_comm_s=rounded,
            bucketed_comm_s=bucketed,
            last_bucket_s=last,
            exposed_s=max(last, bucketed - backward),
            rounded_exposed_s=max(rounded_last, rounded - backward),
        )

    def with_links(self, **links: Link) -> CostModel:
        """A copy with some link kinds' parameters replaced."""
        return replace(self, links={**self.links, **links})


def _buckets(total: float, first: float, rest: float) -> list[float]:
    """Bucket sizes in the order they are reduced (the last layers' gradients first)."""
    out: list[float] = []
    left = float(total)
    cap = first
    while left > 0:
        out.append(min(cap, left))
        left -= out[-1]
        cap = rest
    return out


def _size(nbytes: float) -> str:
    """A byte count as the CLI prints it: 64 KiB, 14.0 GB."""
    if nbytes >= 1e9:
        return f"{nbytes / 1e9:.2f} GB"
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes:g} B"


def _time(seconds: float) -> str:
    """A duration as the CLI prints it: 12.3 us, 4.56 ms, 0.245 s."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1.0:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.3f} s"
