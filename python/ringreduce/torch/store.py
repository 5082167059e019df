"""Meeting through torch's store: the engine's rendezvous store over a c10d Store, and
the address other ranks reach this one at."""

from __future__ import annotations

from typing import Any, Optional

from .. import _core
from .._env import master_addr


class _StoreAdapter:
    """The engine's store interface over a c10d Store (called from the engine's threads)."""

    def __init__(self, store: Any):
        self._store = store

    def set(self, key: str, value: bytes) -> None:
        self._store.set(key, value)

    def try_get(self, key: str) -> Optional[bytes]:
        if self._store.check([key]):
            return self._store.get(key)
        return None

    def set_if_absent(self, key: str, value: bytes) -> bytes:
        return self._store.compare_set(key, "", value)


def _advertise(store: Any) -> str:
    """The address of ours other ranks reach: towards the store's host (TCPStore),
    else MASTER_ADDR, else the engine's default (RINGREDUCE_SOCKET_ADDR overrides)."""
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    host = getattr(store, "host", None) or master_addr()
    if not host:
        return ""
    try:
        return _core.local_ip_towards(host)
    except Exception:
        return ""
