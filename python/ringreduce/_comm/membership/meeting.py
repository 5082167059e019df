"""Where the members of a communicator being made by shrink (and grow) meet: a client of
the agreement host's standby store that names the host when it goes or stops, and can
tell whether a member's process is gone (`membership`, `growth`)."""

from __future__ import annotations

import errno
import selectors
import socket
import time
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from ... import _core
from ...errors import PeerError
from . import processes

__all__ = ["MeetingStore", "alive", "held_get", "look_ms", "probe", "refused", "silent_throughout"]

_FEW = 64  # members, at most, of a meeting whose waits look for the dead often
_LOOK_FEW_MS = 10
_LOOK_MANY_MS = _core.PEER_LOOK_MS  # as every rendezvous wait looks


def held_get(store: Any, key: str, cap: float, deadline: float) -> Optional[bytes]:
    """``store.wait_get(key)``, held by the store for at most ``cap`` seconds and never
    past ``deadline`` (a ``time.monotonic()`` time): the value, or None if not set yet."""
    held = max(0.0, min(cap, deadline - time.monotonic()))
    return store.wait_get(key, int(held * 1000))


class MeetingStore:
    """The store a shrunk communicator meets through and reports failures to: a client
    of the host's standby store, which knows whether it is served in this process and
    whether its host died (so that the engine names the host, its rank 0, when the
    store goes away with it)."""

    def __init__(
        self,
        store: Any,
        hosted_here: bool,
        members: Optional[List[Tuple[str, int]]] = None,
        procs: Optional[List[Optional[processes.Process]]] = None,
    ):
        self._store = store
        self._hosted_here = hosted_here
        self._members = members or []  # each new rank's standby address, where known
        self._procs = procs or []  # and its process, where known and stops count as gone

    def set(self, key: str, value: bytes) -> None:
        self._host_answers()
        self._store.set(key, value)

    def try_get(self, key: str) -> Optional[bytes]:
        self._host_answers()
        return self._store.try_get(key)

    def claim(self, key: str, value: bytes) -> bytes:
        """set_if_absent, without the store telling its other clients (a seat)."""
        self._host_answers()
        return self._store.claim(key, value)

    def set_many(self, items: List[Tuple[str, bytes]]) -> None:
        """set of each (key, value), in one round trip to the host's store."""
        self._host_answers()
        self._store.set_many(items)

    def try_get_many(self, keys: List[str]) -> List[Optional[bytes]]:
        """try_get of each key, in one round trip to the host's store."""
        self._host_answers()
        return self._store.try_get_many(keys)

    def wait_get(self, key: str, ms: int) -> Optional[bytes]:
        """The value of key, waiting up to ms for it: the host's store holds the request
        until the key is set, so the members meet without polling. (A host stopped
        meanwhile fails the request: `Membership._connect` made the client so.)"""
        self._host_answers()
        return self._store.wait_get(key, ms)

    def set_if_absent(self, key: str, value: bytes) -> bytes:
        self._host_answers()
        return self._store.set_if_absent(key, value)

    def hosted_here(self) -> bool:
        return self._hosted_here

    def host_lost(self) -> bool:
        return bool(self._store.host_lost()) or self._host_stopped()

    def host_unreachable(self) -> bool:
        """The host's machine answered nothing for the keepalive time (the client was
        made with it): the engine then reports the host unreachable, not dead."""
        return not self._hosted_here and bool(self._store.host_unreachable())

    def _host_stopped(self) -> bool:
        """The host (the new rank 0) is stopped on this machine, or gone."""
        return not self._hosted_here and self._stopped(0)

    def _stopped(self, rank: int) -> bool:
        return 0 <= rank < len(self._procs) and processes.halted(self._procs[rank])

    def _host_answers(self) -> None:
        """Raises PeerError naming the host when it is stopped: each request to its store
        would wait out the store's I/O timeout, and the making fails at once instead
        (the members then agree again, without it)."""
        if self._host_stopped():
            err = PeerError(
                "rank 0 of the communicator being made, whose standby store the members "
                "meet on, is stopped (or gone) on this machine"
            )
            err.peer = 0
            raise err

    def ends_with_attempt(self) -> bool:
        """False: the host's standby store outlives a failed making (the members agree
        again on it), so the host need not linger for the others to read the error."""
        return False

    def peer_gone(self, rank: int) -> bool:
        """True when rank ``rank``'s process is gone (its standby store refuses) or, on
        this machine, stopped: a member stopped while the communicator is made would
        hold up every other member until the timeout."""
        return self._stopped(rank) or (
            0 <= rank < len(self._members) and refused(self._members[rank])
        )

    def peer_look_ms(self) -> int:
        """How often (ms) a wait for a member's key asks `peer_gone` about it: often in
        a meeting of few ranks, where a probe is one local connect, so that a member
        that dies while the communicator is made is named within milliseconds; as
        rarely as any rendezvous in a large one, where every waiting rank's probes
        would land on the one it waits for."""
        return look_ms(len(self._members))


def look_ms(members: int) -> int:
    """`MeetingStore.peer_look_ms` for a meeting of ``members`` ranks."""
    return _LOOK_FEW_MS if members <= _FEW else _LOOK_MANY_MS


def alive(store: MeetingStore) -> Callable[[int], bool]:
    return lambda rank: not store.peer_gone(rank)


def refused(address: Tuple[str, int]) -> bool:
    """True when nothing listens on address: the rank's process is gone."""
    return probe(address) == "refused"


def probe(address: Tuple[str, int]) -> str:
    """How a rank's standby port answers a connection: "answered" (its process, or at
    least its machine's kernel: a stopped process's still completes the handshake),
    "refused" (its machine answered that nothing listens: the process is gone) or
    "silent" (no answer within 0.2 s, or no route to it: its machine, or the network
    to it, is down) or "unknown" (an error of this side's, e.g. no file descriptor
    left: evidence of nothing)."""
    try:
        with socket.create_connection(address, timeout=0.2):
            return "answered"
    except ConnectionRefusedError:
        return "refused"
    except TimeoutError:  # socket.timeout
        return "silent"
    except OSError as exc:
        return "silent" if exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH) else "unknown"


def silent_throughout(addresses: Dict[int, Tuple[str, int]], seconds: float) -> Set[int]:
    """The ranks whose standby port answers no connection for ``seconds`` (their machine,
    or the network to it, is down), all tried at once: what `probe` says "silent" to,
    waited out for every rank together rather than one after the other. A rank whose
    machine answers (accepted, or refused) or whose connect fails on this side is not
    silent."""
    pending: Dict[socket.socket, int] = {}
    silent: Set[int] = set()
    with selectors.DefaultSelector() as sel:
        try:
            for rank, address in addresses.items():
                try:
                    sock = socket.socket(socket.AF_INET6 if ":" in address[0] else socket.AF_INET)
                except OSError:
                    continue  # no descriptor left: evidence of nothing
                sock.setblocking(False)
                code = sock.connect_ex(address)
                if code in (errno.EINPROGRESS, errno.EAGAIN):
                    pending[sock] = rank
                    sel.register(sock, selectors.EVENT_WRITE)
                    continue
                if code in (errno.EHOSTUNREACH, errno.ENETUNREACH):
                    silent.add(rank)
                sock.close()
            end = time.monotonic() + seconds
            while pending and (left := end - time.monotonic()) > 0:
                for key, _ in sel.select(left):
                    sock = key.fileobj
                    code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if code in (errno.EHOSTUNREACH, errno.ENETUNREACH):
                        silent.add(pending[sock])
                    sel.unregister(sock)
                    sock.close()
                    del pending[sock]
            silent.update(pending.values())  # no answer at all within the time
        finally:
            for sock in pending:
                sock.close()
    return silent
