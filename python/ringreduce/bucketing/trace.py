"""Per-bucket timing of a GradientBucketer: events, the exposed-communication summary and
the chrome-trace export.

Times come from `time.perf_counter`, which on Linux reads CLOCK_MONOTONIC: traces that
local ranks save share one clock and can be loaded together in Perfetto.
"""

from __future__ import annotations

import json
import os
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["BucketEvent", "Observability", "Timeline"]


@dataclass(frozen=True)
class BucketEvent:
    """One bucket in one step. ``done`` is when the bucketer first saw the all-reduce
    finished (polled from ready() and wait()), so it can be late, never early."""

    step: int
    bucket: int
    params: int
    nbytes: int
    first_ready: float | None
    last_ready: float | None
    launch: float
    done: float


def _busy_time(events: list[BucketEvent]) -> float:
    """Length of the union of the [launch, done] intervals: the time the communicator spent
    on this step's buckets, counting overlapping in-flight buckets once."""
    total = 0.0
    end = float("-inf")
    for e in sorted(events, key=lambda e: e.launch):
        start = max(e.launch, end)
        if e.done > start:
            total += e.done - start
        end = max(end, e.done)
    return total


class Timeline:
    """Collects the BucketEvents of every step; keeps the last ``max_steps`` for the trace
    and running totals of all steps for the summary."""

    def __init__(self, rank: int, max_steps: int) -> None:
        self._rank = rank
        self._steps: deque[list[BucketEvent]] = deque(maxlen=max_steps)
        self._count = 0
        self._comm_s = 0.0
        self._exposed_s = 0.0
        self._writeback_s = 0.0
        self._bucket_comm_s: list[float] = []
        self._bucket_shape: list[tuple[int, int]] = []

    def record_step(self, events: list[BucketEvent], exposed_s: float, writeback_s: float) -> None:
        """Adds one synchronised step: its bucket events, the time wait() was blocked on
        communication and the time it spent copying results back."""
        self._steps.append(events)
        self._count += 1
        self._comm_s += _busy_time(events)
        self._exposed_s += exposed_s
        self._writeback_s += writeback_s
        if not self._bucket_comm_s:
            self._bucket_comm_s = [0.0] * len(events)
            self._bucket_shape = [(e.params, e.nbytes) for e in events]
        for e in events:
            self._bucket_comm_s[e.bucket] += e.done - e.launch

    def record_buckets(
        self, step: int, buckets: list[Any], start: float, blocked_end: float, end: float
    ) -> None:
        """record_step from a bucketer's buckets at the end of wait(): wait() began at
        ``start``, stopped waiting for communication at ``blocked_end`` and finished copying
        results back at ``end``. A bucket not launched or seen done before wait() counts
        from ``start`` / until ``blocked_end``."""
        events = [
            BucketEvent(
                step,
                b.index,
                len(b.params),
                b.nbytes,
                b.first_ready,
                b.last_ready,
                b.launch or start,
                b.done or blocked_end,
            )
            for b in buckets
        ]
        self.record_step(events, exposed_s=blocked_end - start, writeback_s=end - blocked_end)

    def summary(self) -> dict[str, Any]:
        """Totals over every recorded step; see GradientBucketer.summary."""
        steps = max(self._count, 1)
        return {
            "rank": self._rank,
            "steps": self._count,
            "buckets": len(self._bucket_shape),
            "bytes_per_step": sum(nbytes for _, nbytes in self._bucket_shape),
            "comm_s": self._comm_s,
            "exposed_s": self._exposed_s,
            "hidden_s": max(self._comm_s - self._exposed_s, 0.0),
            "exposed_fraction": self._exposed_s / self._comm_s if self._comm_s > 0 else 0.0,
            "writeback_s": self._writeback_s,
            "per_bucket": [
                {
                    "bucket": i,
                    "params": params,
                    "bytes": nbytes,
                    "mean_comm_s": self._bucket_comm_s[i] / steps,
                }
                for i, (params, nbytes) in enumerate(self._bucket_shape)
            ],
        }

    def chrome_trace(self) -> dict[str, Any]:
        """The retained steps as a chrome-trace object: one complete ("X") event per bucket
        per step on pid = rank, timestamps in microseconds."""
        trace: list[dict[str, Any]] = [
            {
                "name": "process_name",
                "ph": "M",
                "pid": self._rank,
                "tid": 0,
                "args": {"name": f"rank {self._rank}"},
            },
            {
                "name": "thread_name",
                "ph": "M",
                "pid": self._rank,
                "tid": 0,
                "args": {"name": "gradient buckets"},
            },
        ]
        for events in self._steps:
            for e in events:
                args = asdict(e)
                for key in ("first_ready", "last_ready", "launch", "done"):
                    args[key] = None if args[key] is None else args[key] * 1e6
                trace.append(
                    {
                        "name": f"bucket {e.bucket}",
                        "cat": "allreduce",
                        "ph": "X",
                        "ts": e.launch * 1e6,
                        "dur": max(e.done - e.launch, 0.0) * 1e6,
                        "pid": self._rank,
                        "tid": 0,
                        "args": args,
                    }
                )
        return {"traceEvents": trace, "displayTimeUnit": "ms"}

    def save(self, path: str | os.PathLike) -> None:
        """Writes chrome_trace() as JSON to ``path``."""
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.chrome_trace(), f)


class Observability:
    """GradientBucketer's summary and trace (a mixin: they read its ``_timeline``)."""

    _timeline: Timeline

    def summary(self) -> dict[str, Any]:
        """Communication time per step, and how much of it was exposed.

        Keys: ``steps``; ``buckets`` and ``bytes_per_step``; ``comm_s`` (total time some
        bucket's all-reduce was in flight, over all steps); ``exposed_s`` (time `wait` was
        blocked launching or waiting for all-reduces: communication not hidden behind
        backward); ``hidden_s``; ``exposed_fraction`` = exposed_s / comm_s; ``writeback_s``
        (copying results out in `wait`); ``per_bucket`` (params, bytes, mean_comm_s).
        Completion is observed by polling, so comm_s can be slightly high.
        """
        return self._timeline.summary()

    def save_trace(self, path: str | Any) -> None:
        """Writes the recent steps as chrome-trace JSON (open in Perfetto or
        chrome://tracing): one complete event per bucket per step, from launch to done,
        with pid = rank, and the ready times and byte count in its args."""
        self._timeline.save(path)
