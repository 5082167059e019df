"""Meeting through torch's store: the engine's rendezvous store over a c10d Store, the
address other ranks reach this one at, and `meet`, which makes a process group's
communicator there (armed with standby stores, so that it can shrink)."""

from __future__ import annotations

import datetime
from typing import Any, Optional

from .. import _core
from .._comm.communicator import Communicator
from .._comm.membership.agreement import arm
from .._env import engine_options, master_addr


class _StoreAdapter:
    """The engine's store interface over a c10d Store (called from the engine's threads).
    Once a call failed (its host died: a TCPStore never reconnects), later ones fail at
    once, rather than each logging torch's warning and stack again."""

    def __init__(self, store: Any):
        self._store = store
        self._broken: Optional[BaseException] = None

    def _call(self, method: str, *args: Any) -> Any:
        if self._broken is not None:
            raise RuntimeError(f"torch's store failed earlier: {self._broken}")
        try:
            return getattr(self._store, method)(*args)
        except Exception as exc:
            self._broken = exc
            raise

    def set(self, key: str, value: bytes) -> None:
        self._call("set", key, value)

    def try_get(self, key: str) -> Optional[bytes]:
        if self._call("check", [key]):
            return self._call("get", key)
        return None

    def set_if_absent(self, key: str, value: bytes) -> bytes:
        return self._call("compare_set", key, "", value)


def _store_host(store: Any) -> str:
    """The host of torch's store (TCPStore), else MASTER_ADDR, else "" (unknown)."""
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    return getattr(store, "host", None) or master_addr() or ""


def _advertise(store: Any) -> str:
    """The address of ours other ranks reach: towards the store's host (TCPStore),
    else MASTER_ADDR, else the engine's default (RINGREDUCE_SOCKET_ADDR overrides)."""
    host = _store_host(store)
    if not host:
        return ""
    try:
        return _core.local_ip_towards(host)
    except Exception:
        return ""


def meet(store: Any, rank: int, size: int, timeout: Optional[datetime.timedelta]) -> Communicator:
    """A process group's communicator, met through torch's store (a collective: every rank
    of the group calls it). Each rank also serves a standby store and learns the others'
    (`_comm.membership.agreement`): that is where survivors meet to shrink when a rank died, even
    the host of torch's store (`shrink`)."""
    seconds = timeout.total_seconds() if timeout else 1800.0
    options = engine_options("auto", seconds)
    core = _core.Communicator.create_with_store(
        _StoreAdapter(store),
        rank,
        size,
        _advertise(store),
        "the torch.distributed store",
        options,
    )
    try:
        membership = arm(core, _store_host(store), options.token, options)
    except BaseException:
        core.close()
        raise
    # torch leaves the order of calls from several threads to the program (DDP hooks,
    # future callbacks): they take turns here rather than raise ConcurrentUseError.
    comm = Communicator(core, queue_threads=True, membership=membership)
    # Rank 0 returns only once every rank has finished meeting through the store:
    # rank 0 hosts it (env://, rr.torch.init_process_group), and returning and
    # exiting at once (a short script) would take it away from ranks still reading
    # it. Through the store rather than a collective, so that the program's first
    # collective is the group's call #1 in every message that numbers calls.
    store.set(f"ringreduce/met/{rank}", b"1")
    if rank == 0:
        store.wait([f"ringreduce/met/{r}" for r in range(size)], timeout)
    return comm
