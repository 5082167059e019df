"""Surviving a dead rank, as methods of Communicator: revoked, failed_ranks, agree,
shrink, grow (the protocols are in `membership` and `growth`)."""

from __future__ import annotations

from typing import Any, FrozenSet, Optional

from ..errors import PeerError, RingReduceError
from . import growth
from .membership import Membership

__all__ = ["Resilience"]


class Resilience:
    """Communicator's fault-tolerance methods (a mixin: ``_core`` and ``_membership``
    are the communicator's)."""

    _core: Any
    _membership: Optional[Membership]
    _lane: Any

    @property
    def revoked(self) -> bool:
        """True once the communicator failed (a peer died, left or timed out, calls
        disagreed) or was aborted: every later collective raises PeerError; agree,
        shrink and close still work."""
        return bool(self._core.failure)

    @property
    def failed_ranks(self) -> FrozenSet[int]:
        """The set of ranks known to be dead (the same on every survivor after ``agree``
        or ``shrink``)."""
        return frozenset() if self._membership is None else frozenset(self._membership.failed)

    def agree(self, flag: bool = True, timeout: Optional[float] = None) -> bool:
        """A fault-tolerant AND of ``flag`` over the live members; every survivor calls it
        and gets the same answer and the same ``failed_ranks``. Works on a revoked
        communicator; a rank counted dead (silent until ``timeout``, default the
        communicator's) gets PeerError. So does every member when they are not the
        majority of the live part (see ``shrink``)."""
        return bool(self._live_membership("agree").agree(flag, self._timeout(timeout))["flag"])

    def shrink(self, timeout: Optional[float] = None) -> Any:
        """A new communicator of the survivors (every survivor calls it): ranks renumbered
        in the old order, the same transport and token, meeting on the standby store of
        the lowest survivor, so it works when rank 0 is the one that died.

        Ranks counted dead without proof that their process is gone (their machine
        answered nothing, or they stayed silent) may be alive on the other side of a
        network partition: the survivors go on only when they outnumber those, or equal
        them and hold the lowest rank of all, and otherwise every one of them raises
        PeerError ("no majority"), so the two sides never both go on."""
        core, membership = self._live_membership("shrink").shrink(self._timeout(timeout))
        return type(self)(core, membership=membership)

    def grow(self, world_size: int, timeout: Optional[float] = None) -> Any:
        """A new communicator of the members and ``world_size - self.world_size``
        newcomers, each of which calls ``ringreduce.join()`` (every member calls grow).
        Members keep their ranks; newcomers take the next ones. The newcomers find the
        job at its rendezvous address (MASTER_ADDR/MASTER_PORT), served by the lowest
        member while the grow lasts. This communicator stays usable, whatever happens."""
        core, membership = growth.grow(
            self._live_membership("grow"), world_size, self._timeout(timeout)
        )
        return type(self)(core, membership=membership)

    def _live_membership(self, what: str) -> Membership:
        # Compressed calls issued before this one end first (on a revoked communicator
        # they fail at once): none of them touches its buffers (or error-feedback
        # residuals) after, while the caller restores them for a replay.
        self._lane.drain()
        if self._membership is None:
            raise RingReduceError(
                f"rank {self.rank}: {what}() needs a communicator made by ringreduce.init(); "
                f"this one ({self.transport}, made from another library's communicator) has "
                "no standby stores to meet on"
            )
        return self._membership

    def _timeout(self, timeout: Optional[float]) -> float:
        if timeout is None:
            return self.timeout
        if timeout <= 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        return float(timeout)

    def _revoke(self, exc: RingReduceError) -> RingReduceError:
        """A call failed with exc. If that broke the communicator (it is revoked), the
        peer it blames is known dead, and a refusal of a later call is a PeerError with
        the dead (``failed``); returns the error to raise."""
        if self._membership is None or not self.revoked:
            return exc
        self._membership.note(exc)
        if type(exc) is RingReduceError:  # "failed earlier": a call after the failure
            revoked = PeerError(str(exc))
            failed = sorted(self._membership.failed)
            revoked.peer = failed[0] if failed else None
            revoked.__cause__ = exc
            exc = revoked
        if isinstance(exc, PeerError):
            exc.failed = self.failed_ranks
        return exc
