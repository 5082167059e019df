"""``dist.shrink_group(ranks_to_exclude)`` on the "ringreduce" backend: after a rank died,
the survivors go on in a group of their own, with no restart and no store of torch's
(they meet on the standby store of the lowest survivor, `_comm.membership.agreement`), also when
the dead rank hosted torch's store.

How torch 2.13 shrinks a group (torch/distributed/distributed_c10d.py):

- ``shrink_group`` (line 6368) checks the arguments, then asks
  ``_validate_shrink_backend_requirements`` (6486) for the group's backend:
  ``pg._get_backend(device)`` (6496-6502), which must say ``supports_shrinking`` (6510);
- it calls ``backend.shrink(sorted(ranks_to_exclude), shrink_flags, pg_options)`` (6427);
- ``_finalize_shrunk_group`` (6571) aborts every other group when the default one
  shrinks (6580), destroys the old group (6592), has ``_create_shrunk_process_group``
  (6659) put the returned backend in a new C++ ProcessGroup over a clone of the old
  group's store (6675, 6691), makes that the default group (6601) and records the
  survivors' global ranks (6608).

Two of those steps cannot take a backend written in Python, which ours is (a Python
``ProcessGroup``): ``_get_backend`` finds only C++ backends given to
``_register_backend`` ("No backend type associated with device type cpu", and torch
then raises RuntimeError at 6504), and ``_register_backend`` (6691) takes only a C++
``c10d::Backend``, which Python cannot subclass (it has no constructor). The store's
clone (6675) would also try to reach the dead rank 0 when it hosted torch's TCPStore.
So `install` wraps exactly those two helpers: for a ringreduce group they give torch the
group itself and then the new group that `Shrinking.shrink` made; for any other backend
they are torch's own. Every other step (the checks, aborting and destroying the old
groups, the new default group, the rank mapping) is torch's code, unchanged.
"""

from __future__ import annotations

import datetime
from typing import Any, Callable, List, Optional

import torch.distributed.distributed_c10d as c10d

from .._comm.communicator import Communicator
from ..errors import PeerError

__all__ = ["Shrinking", "install"]

# torch's helpers that `install` wraps; shrinking works only when both are there.
_HELPERS = ("_validate_shrink_backend_requirements", "_create_shrunk_process_group")
_installed = False


class Shrinking:
    """The process group's side of ``dist.shrink_group`` (a mixin of
    ProcessGroupRingReduce: ``comm`` is the group's communicator)."""

    comm: Communicator

    @property
    def supports_shrinking(self) -> bool:
        """True where ``dist.shrink_group`` works on this group: its communicator has
        standby stores to meet on, and this torch has the shrink path `install` wraps."""
        return _installed and getattr(self.comm, "_membership", None) is not None

    def shrink(
        self, ranks_to_exclude: List[int], shrink_flags: int = 0, pg_options: Any = None
    ) -> Any:
        """The group of the ranks not in ``ranks_to_exclude`` (group ranks), renumbered
        in the old order; what ``dist.shrink_group`` calls on every survivor.

        The survivors agree on who is alive (a fault-tolerant agreement on the lowest
        survivor's standby store: milliseconds when the excluded ranks are dead, as
        their ports refuse connections) and build the new communicator there. The
        excluded ranks are counted out even if alive. ``shrink_flags`` SHRINK_ABORT
        aborts this rank's work on the old group first. ``pg_options._timeout`` (a
        timedelta), if given, bounds the agreement; else the group's timeout does.

        Raises PeerError (with ``failed``, the old group's dead ranks) when the
        survivors found other ranks dead too: call ``shrink_group`` again with them.
        """
        excluded = sorted({int(r) for r in ranks_to_exclude})
        membership = self.comm._live_membership("shrink")
        if shrink_flags & c10d.SHRINK_ABORT:
            self.comm.abort()
        # The caller's word: the excluded are out. Those not dead are not waited for
        # beyond a short grace, and none of them hosts the agreement.
        membership.failed.update(excluded)
        membership.gone.update(excluded)
        core, new_membership = membership.shrink(_seconds(pg_options, self.comm.timeout))
        comm = Communicator(core, queue_threads=True, membership=new_membership)
        dead = sorted(membership.failed)
        if dead != excluded:
            comm.close()
            exc = PeerError(
                f"rank {self.comm.rank}: shrink_group({excluded}): the survivors found ranks "
                f"{dead} of the old group dead or absent; call shrink_group({dead})"
            )
            exc.peer = next((r for r in dead if r not in excluded), None)
            exc.failed = frozenset(dead)
            raise exc
        return type(self)(None, comm.rank, comm.world_size, None, comm=comm)


def _seconds(pg_options: Any, default: float) -> float:
    timeout = getattr(pg_options, "_timeout", None)
    if isinstance(timeout, datetime.timedelta) and timeout.total_seconds() > 0:
        return timeout.total_seconds()
    return default


def _ours(pg: Any) -> bool:
    return isinstance(pg, Shrinking)


def install() -> None:
    """Makes ``dist.shrink_group`` take ringreduce groups (see the module's docstring);
    idempotent. Where this torch lacks the helpers, nothing changes and the groups say
    ``supports_shrinking`` False (torch then raises TypeError, as for Gloo)."""
    global _installed
    if _installed or not all(hasattr(c10d, name) for name in _HELPERS):
        return
    validate: Callable[[dict], Any] = c10d._validate_shrink_backend_requirements
    create: Callable[..., Any] = c10d._create_shrunk_process_group

    def _validate_shrink_backend_requirements(group_info: dict) -> Any:
        pg = group_info["process_group"]
        if not _ours(pg):
            return validate(group_info)
        if not pg.supports_shrinking:
            raise TypeError(
                f"Process group backend for '{group_info['group_name']}' does not support "
                "shrinking operations: its ringreduce communicator has no standby stores"
            )
        return pg

    def _create_shrunk_process_group(
        new_backend: Any, remaining_ranks: List[int], metadata: dict, is_default_group: bool
    ) -> Any:
        if not _ours(new_backend):
            return create(new_backend, remaining_ranks, metadata, is_default_group)
        new_backend._set_group_name(metadata["new_group_name"])
        name = metadata["original_group_name"]
        new_backend._set_group_desc("default:shrunken" if is_default_group else f"{name}:shrunk")
        bound: Optional[Any] = metadata.get("bound_device_id")
        if bound is not None:
            new_backend.bound_device_id = bound
        return new_backend

    c10d._validate_shrink_backend_requirements = _validate_shrink_backend_requirements
    c10d._create_shrunk_process_group = _create_shrunk_process_group
    _installed = True
