"""Fault-tolerant steps (``GradientBucketer(fault_tolerant=True)``): when a rank dies
during a step's all-reduces, the survivors shrink the communicator, put every bucket's
local contribution back (buckets already reduced were averaged over the dead rank too),
rescale what was divided for the old world size, and reduce every bucket again among
themselves, so the step finishes with the survivors' average. Only the dead rank's
micro-batch is lost.

With compression, each bucket's error-feedback residual is kept as launched too and put
back before the replay (the calls that ran with the dead rank changed it), so the
survivors' compressed replay adds each residual once.

A death may end a step on some survivors and not on others: a collective completes on
the ranks that received all they needed before the death (a ring's all-gather reaches
some ranks before others). Those that completed the step go on to the next one and
fail there. After the shrink every survivor says which step it is in; when they differ,
those behind take the step's results from the lowest rank ahead (each bucket as kept at
the end of that step) instead of replaying it (the ranks ahead already used them), and
the ranks ahead replay their step, which those behind then take part in as an ordinary
step. Otherwise the two would reduce different steps' gradients together."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import PeerError, RingReduceError

if TYPE_CHECKING:
    from .bucketer import GradientBucketer, _Bucket

__all__ = ["FailedLaunch", "keep_results", "launch_fault_tolerant", "replay"]


class FailedLaunch:
    """The Work of a bucket whose launch was refused (the communicator had failed
    already): done, and raises the refusal when waited on."""

    def __init__(self, error: PeerError):
        self.error = error

    def done(self) -> bool:
        return True

    def wait(self) -> None:
        raise self.error


def launch_fault_tolerant(bucketer: GradientBucketer, bucket: _Bucket) -> None:
    """Launches a bucket, keeping its local contribution (and residual) for a replay; a
    refused launch is replayed by wait(), as is a bucket whose Work fails there."""
    bucket.local = bucketer._memory.snapshot(bucket.buffer)
    bucket.local_divisor = bucket.divisor
    if bucketer._compress is not None:
        bucketer._compress.snapshot(bucket)
    try:
        bucket.work = bucketer._issue(bucket)
    except PeerError as exc:  # failed already: wait() replays the step
        bucket.work = FailedLaunch(exc)


def keep_results(bucketer: GradientBucketer, buckets: list[_Bucket]) -> None:
    """At the end of a step: each bucket's reduced result, kept until the next step ends,
    in its snapshot's memory (the next launch takes a new snapshot)."""
    memory = bucketer._memory
    for bucket in buckets:
        if bucket.local is not None:
            memory.restore(bucket.local, bucket.buffer)
        bucket.kept, bucket.local = bucket.local, None


def replay(bucketer: GradientBucketer, buckets: list[_Bucket]) -> None:
    """Shrinks and reduces every bucket of this step again, until one round completes
    (a rank dying during the replay starts another); or, when other survivors ended
    this step already, takes its results from them (the module's docstring)."""
    while True:
        comm = bucketer._comm.shrink()
        bucketer._comm = comm
        bucketer._world_size = int(comm.world_size)
        bucketer._rank = int(comm.rank)
        try:
            behind = _catch_up(bucketer, buckets, comm)
            if bucketer._in_windows:
                # The windows were the old communicator's: every survivor allocates its
                # buckets again on the new one, here, at the same point on all of them
                # (those behind and those ahead alike), keeping what they hold.
                bucketer._moved = "shrink"
                bucketer._rehome()
            if bucketer._on_membership_change is not None:
                bucketer._on_membership_change(comm)
            if behind:
                return  # this step's results came from the ranks that ended it
            for bucket in buckets:
                _restore(bucketer, bucket)
            for bucket in buckets:
                bucket.work = bucketer._issue(bucket)
            for bucket in buckets:
                bucket.work.wait()
            return
        except PeerError:
            continue


def _catch_up(bucketer: GradientBucketer, buckets: list[_Bucket], comm: Any) -> bool:
    """The survivors' steps, compared (the first call on the shrunk communicator). When
    some ended the step the others are in, the lowest of them broadcasts each bucket's
    kept result. True on a rank that was behind: its buckets hold the step's results."""
    kept = all(bucket.kept is not None for bucket in buckets)
    mine = np.array([bucketer._step, int(kept)], dtype=np.int64)
    steps, kept_by = np.asarray(comm.all_gather(mine)).reshape(-1, 2).T
    first, last = int(steps.min()), int(steps.max())
    if first == last:
        return False
    if last != first + 1:
        raise RingReduceError(
            f"rank {comm.rank}: after the shrink the survivors are in steps {first} to "
            f"{last}: no collective can end a step on some ranks while others are two "
            "steps behind (a bucketer's steps out of step: is every rank calling wait()?)"
        )
    root = int(np.flatnonzero(steps == last)[0])
    behind = bucketer._step == first
    if not kept_by[root]:
        raise RingReduceError(
            f"rank {root}: ended step {first} but kept no result of it to hand to the "
            "survivors behind (the buckets changed between the steps)"
        )
    for bucket in buckets:
        # The ranks ahead already divided by the old world size; those behind take it so.
        # The other ranks ahead receive into their bucket (their replay restores it), not
        # into their kept result: a death during this broadcast may make one of them the
        # next root.
        comm.broadcast(bucket.kept if comm.rank == root else bucket.buffer, root=root)
    if behind:
        for bucket in buckets:
            if bucket.divisor != 1:
                bucket.divisor = bucketer._world_size  # for the next steps, as _restore does
    return behind


def _restore(bucketer: GradientBucketer, bucket: Any) -> None:
    """The bucket's local contribution again, divided for the new world size where it is
    divided before the sum (16-bit buckets; wider ones are averaged by the all-reduce)."""
    memory = bucketer._memory
    factor = 1.0
    if bucket.divisor != 1:
        new = bucketer._world_size
        factor = bucket.local_divisor / new
        memory.restore(bucket.buffer, bucket.local, factor)
        bucket.divisor = new  # for the next steps too
    else:
        memory.restore(bucket.buffer, bucket.local)
    if bucketer._compress is not None:
        bucketer._compress.restore(bucket, factor)
