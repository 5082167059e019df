"""Reading what every rank of a communicator being made publishes in its store, with
errors that name the rank that did not (`membership.arm`, `growth`); and the standby
store every rank serves."""

from __future__ import annotations

import random
import socket
import time
from typing import Any, Callable, Iterable, List, Optional, Tuple

from ... import _core
from ...errors import PeerError, RingReduceError, TimeoutError
from ...launch.ports import standby_band
from .meeting import look_ms

__all__ = ["fetch_all_named", "fetch_named", "on_this_machine", "standby_server", "standby_table"]

_GRACE = 1.0  # seconds a rank waits for rank 0's table beyond rank 0's own timeout


def standby_table(
    core: Any, rank: int, size: int, timeout: float, alive: Optional[Callable[[int], bool]]
) -> List[str]:
    """Every rank's standby entry, in rank order. Rank 0 reads them and publishes them as
    one key, which the others read: 2N reads of the store in all, not N² (the store's
    host served every rank's read of every key). A rank that rank 0 waited for in vain
    is published there instead, so every rank raises the same error naming it. Rank 0
    names it within ``timeout``; the others wait a little longer for rank 0's word, then
    look for the missing entry themselves."""
    if rank == 0:
        try:
            keys = [f"standby/{r}" for r in range(size)]
            entries = [e.decode() for e in fetch_all_named(core, keys, range(size), timeout, alive)]
        except (PeerError, TimeoutError) as exc:
            why = str(exc).split(": ", 1)[-1]  # without "rank 0: "
            core.publish("standby/all", f"!{exc.peer} {type(exc).__name__} {why}".encode())
            raise
        core.publish("standby/all", "\n".join(entries).encode())
        return entries
    try:
        table = fetch_named(core, "standby/all", 0, timeout + _GRACE, alive).decode()
    except TimeoutError as exc:
        # Rank 0 came late, or is stuck: name the rank whose entry is missing, as rank 0
        # would (rank 0 itself when every entry is there).
        for r in range(size):
            try:
                core.fetch(f"standby/{r}", 0.0)
            except TimeoutError:
                err = TimeoutError(
                    f"rank {rank}: rank {r} did not set 'standby/{r}' while the "
                    f"communicator was being made: not within {timeout:g} s"
                )
                err.peer = r
                raise err from exc
        raise
    if table.startswith("!"):
        peer, kind, why = table[1:].split(" ", 2)
        err: RingReduceError = (PeerError if kind == "PeerError" else TimeoutError)(
            f"rank {rank}: {why}"
        )
        err.peer = int(peer)
        raise err
    return table.split("\n")


def fetch_all_named(
    core: Any,
    keys: List[str],
    peers: Iterable[int],
    timeout: float,
    alive: Optional[Callable[[int], bool]],
) -> List[bytes]:
    """`fetch_named` of every key (``peers``: the rank that sets each), those set
    already read together (one round trip, not one a key); for the first missing one
    a wait as fetch_named's, then the rest read together again."""
    peers = list(peers)
    got: List[Optional[bytes]] = list(core.try_fetch_many(keys))
    for i, key in enumerate(keys):
        if got[i] is None:
            got[i] = fetch_named(core, key, peers[i], timeout, alive)
            rest = [j for j in range(i + 1, len(keys)) if got[j] is None]
            for j, value in zip(rest, core.try_fetch_many([keys[j] for j in rest])):
                got[j] = value
    return [value for value in got if value is not None]


def fetch_named(
    core: Any, key: str, peer: int, timeout: float, alive: Optional[Callable[[int], bool]]
) -> bytes:
    """core.fetch(key) of a key rank ``peer`` sets; its errors name that rank."""
    deadline = time.monotonic() + timeout
    # Seconds between looks at whether the member awaited is still there.
    look = look_ms(int(core.world_size)) / 1000
    while True:
        left = deadline - time.monotonic()
        try:
            return core.fetch(key, max(0.0, left if alive is None else min(left, look)))
        except TimeoutError:
            if time.monotonic() < deadline and (alive is None or alive(peer)):
                continue
            gone = time.monotonic() < deadline
            why = "its process is gone" if gone else f"not within {timeout:g} s"
            err: RingReduceError = (PeerError if gone else TimeoutError)(
                f"rank {int(core.rank)}: rank {peer} did not set {key!r} while the "
                f"communicator was being made: {why}"
            )
            err.peer = peer
            raise err from None


def standby_server(toward: str, timeout: float, token: str) -> Tuple[Any, str]:
    """(a standby store for this rank, the address it is reached at): the address of
    this machine that ranks reaching ``toward``, the job's rendezvous host, reach."""
    loopback = toward in ("127.0.0.1", "localhost", "") or toward.startswith("127.")
    advertise = "127.0.0.1" if loopback else _core.local_ip_towards(toward)
    return _standby_server(advertise, timeout, token), advertise


def _standby_server(host: str, timeout: float, token: str) -> Any:
    """This rank's standby store, on a free port of the standby band (launch.ports), just
    below the kernel's ephemeral range: every rank of every communicator serves one; ports
    the kernel hands out (port 0) are what other programs' connects take, and the band is
    one that launchers (``free_port``) never give a job."""
    first, end = standby_band()
    for _ in range(16):
        port = random.randrange(first, end)
        try:
            return _core.TcpStore(host, port, True, timeout, min(timeout, 5.0), token)
        except RingReduceError:
            continue  # taken: another one
    return _core.TcpStore(host, 0, True, timeout, min(timeout, 5.0), token)


def on_this_machine(address: Optional[Tuple[str, int]]) -> bool:
    """Whether this process could listen on ``address``'s host: it is one of this
    machine's addresses (binding to another machine's fails)."""
    if address is None:
        return False
    try:
        infos = socket.getaddrinfo(address[0], 0, type=socket.SOCK_STREAM)
    except OSError:
        return False
    for family, kind, proto, _, where in infos:
        try:
            with socket.socket(family, kind, proto) as probe:
                probe.bind(where)
            return True
        except OSError:
            continue
    return False
