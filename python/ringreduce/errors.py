"""The exceptions ringreduce raises.

Every error names the rank that saw it; errors caused by another rank carry
that rank in ``.peer``. Bad local arguments raise ``ValueError``/``TypeError``
before any communication.
"""

from __future__ import annotations

import builtins
from typing import FrozenSet, Optional, Tuple

__all__ = [
    "RingReduceError",
    "TimeoutError",
    "PeerError",
    "MismatchError",
    "ConcurrentUseError",
    "AuthenticationError",
]


class RingReduceError(RuntimeError):
    """Base class of ringreduce's errors. ``peer`` is the rank to blame, if known."""

    peer: Optional[int] = None


class TimeoutError(RingReduceError, builtins.TimeoutError):  # noqa: A001
    """A wait passed its deadline. ``peer`` is the rank that was waited on."""


class PeerError(RingReduceError):
    """A peer died, closed its connection or failed. ``peer`` is its rank; ``failed`` is
    the set of ranks this one knows to be dead (see ``Communicator.shrink``).

    ``reason`` says what is known beyond the message: "unreachable" when the peer's
    machine answered nothing (TCP keepalive probes, or a request's retransmissions,
    went unacknowledged: a network partition, a frozen or powered-off host; a stopped
    or busy process's kernel still answers), None when nothing more is known. Every
    rank that learns of the failure from the first one's report gets the same."""

    failed: FrozenSet[int] = frozenset()
    reason: Optional[str] = None


class MismatchError(RingReduceError):
    """Ranks called different collectives, or with different count/dtype/op/root.

    Both sides of the disagreement are attributes (None when the engine could not know
    them): ``reason`` ("call": different collectives or arguments; "thread": the same
    call issued by differently named threads on two ranks; "segments": different
    RINGREDUCE_SEGMENT_BYTES; "blocks": all_to_all block sizes; "message": a
    point-to-point message of another size than its receive), ``ranks`` (the rank whose
    side was received, the rank that found the disagreement), ``calls`` (each side as
    the user wrote it) and ``issuers`` (each side's issuing-thread tag, 0 when not told).
    """

    reason: Optional[str] = None
    ranks: Optional[Tuple[int, int]] = None
    calls: Optional[Tuple[str, str]] = None
    issuers: Optional[Tuple[int, int]] = None


class ConcurrentUseError(RingReduceError):
    """Two threads issued collectives on one communicator at the same time. Calls are
    paired across ranks in the order each rank issues them, so calls from racing threads
    may pair with another thread's call elsewhere: once this is raised, every later
    collective on that communicator raises it too (see ``Communicator``)."""


class AuthenticationError(RingReduceError):
    """This process could not prove the job's token (RINGREDUCE_TOKEN, or ``init(token=)``)
    to the rendezvous store, or the store could not prove it to us: the token is missing,
    differs from rank 0's, or another program answers on the store's port. Nothing of the
    job was read or changed."""
