"""Fault-tolerant steps (``GradientBucketer(fault_tolerant=True)``): when a rank dies
during a step's all-reduces, the survivors shrink the communicator, put every bucket's
local contribution back (buckets already reduced were averaged over the dead rank too),
rescale what was divided for the old world size, and reduce every bucket again among
themselves, so the step finishes with the survivors' average. Only the dead rank's
micro-batch is lost.

With compression, each bucket's error-feedback residual is kept as launched too and put
back before the replay (the calls that ran with the dead rank changed it), so the
survivors' compressed replay adds each residual once."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import PeerError

if TYPE_CHECKING:
    from .bucketer import GradientBucketer, _Bucket

__all__ = ["FailedLaunch", "launch_fault_tolerant", "replay"]


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


def replay(bucketer: GradientBucketer, buckets: list[_Bucket]) -> None:
    """Shrinks and reduces every bucket of this step again, until one round completes
    (a rank dying during the replay starts another)."""
    while True:
        comm = bucketer._comm.shrink()
        bucketer._comm = comm
        bucketer._world_size = int(comm.world_size)
        bucketer._rank = int(comm.rank)
        for bucket in buckets:
            _restore(bucketer, bucket)
        if bucketer._on_membership_change is not None:
            bucketer._on_membership_change(comm)
        try:
            for bucket in buckets:
                bucket.work = bucketer._issue(bucket)
            for bucket in buckets:
                bucket.work.wait()
            return
        except PeerError:
            continue


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
