"""A communicator's fault tolerance, as the component it holds (`Resilience`): whether it
is revoked, the ranks known dead, agree, shrink and grow (the protocols are in
`agreement` and `growth`), and what a failed call's error becomes once it is revoked."""

from __future__ import annotations

from typing import Any, Callable, FrozenSet, Optional, Tuple

from ...errors import PeerError, RingReduceError
from . import growth
from .agreement import Membership

__all__ = ["Resilience"]


class Resilience:
    """The membership side of one communicator: its standby stores (``membership``, None
    for a communicator made from another library's), over its engine ``core``.

    ``before`` runs first in agree, shrink and grow: the communicator's compressed calls
    issued before them end then (``Lane.drain``), so that none touches its buffers after,
    while the caller restores them for a replay. It holds no reference to the
    communicator, so that a dropped communicator is freed at once."""

    def __init__(self, core: Any, membership: Optional[Membership], before: Callable[[], None]):
        self._core = core
        self.membership = membership
        self._before = before

    @property
    def revoked(self) -> bool:
        return bool(self._core.failure)

    @property
    def failed_ranks(self) -> FrozenSet[int]:
        return frozenset() if self.membership is None else frozenset(self.membership.failed)

    def agree(self, flag: bool, timeout: Optional[float]) -> bool:
        return bool(self.live("agree").agree(flag, self._timeout(timeout))["flag"])

    def shrink(self, timeout: Optional[float]) -> Tuple[Any, Membership]:
        """(the survivors' engine communicator, its membership)."""
        return self.live("shrink").shrink(self._timeout(timeout))

    def grow(self, world_size: int, timeout: Optional[float]) -> Tuple[Any, Membership]:
        """(the grown engine communicator, its membership)."""
        return growth.grow(self.live("grow"), world_size, self._timeout(timeout))

    def live(self, what: str) -> Membership:
        """The membership, for ``what`` (agree, shrink, grow) to run on."""
        self._before()
        if self.membership is None:
            raise RingReduceError(
                f"rank {int(self._core.rank)}: {what}() needs a communicator made by "
                f"ringreduce.init(); this one ({self._core.transport}, made from another "
                "library's communicator) has no standby stores to meet on"
            )
        return self.membership

    def _timeout(self, timeout: Optional[float]) -> float:
        if timeout is None:
            return float(self._core.timeout)
        if timeout <= 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        return float(timeout)

    def revoke(self, exc: RingReduceError) -> RingReduceError:
        """A call failed with exc. If that broke the communicator (it is revoked), the
        peer it blames is known dead, and a refusal of a later call is a PeerError with
        the dead (``failed``); returns the error to raise."""
        if self.membership is None or not self.revoked:
            return exc
        self.membership.note(exc)
        if type(exc) is RingReduceError:  # "failed earlier": a call after the failure
            revoked = PeerError(str(exc))
            failed = sorted(self.membership.failed)
            revoked.peer = failed[0] if failed else None
            revoked.__cause__ = exc
            exc = revoked
        if isinstance(exc, PeerError):
            exc.failed = self.failed_ranks
        return exc
