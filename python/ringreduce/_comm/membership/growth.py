"""Growing a communicator: newcomers join a running job (``comm.grow`` / ``rr.join``).

The members of a communicator call ``grow(world_size)``; each newcomer calls ``join()``
in a new process, found through the same environment as ``init`` (MASTER_ADDR,
MASTER_PORT, the token). No service outside the job:

1. The members agree (`membership.Membership.agree`): every member must be alive, and
   the lowest of them, the *host*, is where everyone meets.
2. The lowest member on the machine of the job's rendezvous address (rank 0 while it
   lives; each member said at arming whether it could listen there) opens a *lobby* at
   that address (the store stopped listening there once every rank of the first
   communicator had met) and writes in it where to meet: the host's standby store, a
   fresh meeting prefix, the old and new sizes, the members' settings. The lobby only
   points the way; it closes when the grow ends.
3. A newcomer reaches the lobby (retrying until its timeout, so it may start before
   the members call grow), takes the first free seat (ranks old_size..world_size-1) on
   the host's standby store, and everyone builds the new communicator there
   (``create_with_store``), members keeping their ranks.

A newcomer with the wrong token is refused by the lobby (AuthenticationError on its
side) and the members do not notice. A newcomer that dies while joining makes the
members' grow fail with an error naming its rank: at once when it had taken its seat
(the seat names its standby store, which refuses connections once it is gone), within
the timeout when it never took one; their communicator is untouched, so they may grow
again. Members that die meanwhile are named at once the same way.

When no member is left on the rendezvous address's machine (every rank there died),
grow fails at once on every member, saying so: newcomers could not find the job.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Dict, List, Optional, Set, Tuple

from ... import _core, _env
from ...errors import PeerError, RingReduceError, TimeoutError
from .agreement import Membership, arm, standby_server
from .meeting import MeetingStore, alive, held_get, refused

__all__ = ["grow", "join"]

_LOBBY_KEY = "ringreduce/lobby"
_POLL = 0.005
_HELD = 0.05  # seconds a standby store may hold a wait for the lobby's state


def grow(membership: Membership, world_size: int, timeout: float) -> Tuple[Any, Membership]:
    """On every member: (the engine's communicator of members + newcomers, its
    Membership). ``timeout`` bounds the agreement and the wait for the lobby; the
    newcomers must then link up within the communicator's own timeout."""
    m = membership
    if not isinstance(world_size, int) or isinstance(world_size, bool):
        raise TypeError(f"world_size must be an int, got {type(world_size).__name__}")
    if world_size <= m.size:
        raise ValueError(
            f"grow(world_size={world_size}): the communicator already has {m.size} ranks; "
            "give the size it should have with the newcomers"
        )
    if m.lobby is None:
        raise RingReduceError(
            f"rank {m.rank}: grow() needs a communicator that met at a TCP address "
            "(MASTER_ADDR/MASTER_PORT), where newcomers find the job; this one met through "
            "a store directory or MPI"
        )
    decision = m.agree(True, timeout)
    if decision["failed"]:
        raise PeerError(
            f"rank {m.rank}: cannot grow while rank(s) {decision['failed']} are dead: "
            "shrink() first, then grow the shrunk communicator"
        )
    deadline = time.monotonic() + timeout
    store, host = decision["store"], decision["host"]
    server = next((r for r in decision["members"] if r in m.lobby_ranks), None)
    if server is None:  # the same answer on every member: they agreed on the members
        raise RingReduceError(
            f"rank {m.rank}: cannot grow: no member is on the machine of the job's "
            f"rendezvous address {m.lobby[0]}:{m.lobby[1]} (MASTER_ADDR/MASTER_PORT), "
            "where newcomers look for the job; the ranks that were there are dead"
        )
    prefix = f"{m.id}grow/{m.rounds}/{host}"
    lobby = None
    if m.rank == server:
        lobby = _open_lobby(m, store, prefix, world_size, timeout, host)
    else:
        _await_lobby(store, prefix, deadline, server, m.rank)
    # A member or newcomer that dies while the communicator is made is named at once:
    # its standby store stops answering.
    meeting = _GrowMeeting(store, host == m.rank, m.addresses, prefix)
    try:
        addr = m.addresses[host][0]
        core = _core.Communicator.create_with_store(
            meeting, m.rank, world_size, _advertise(addr), prefix, m.options
        )
    except RingReduceError as exc:
        raise _explained(exc, store, prefix, host, m.rank) from exc
    finally:
        if lobby is not None:
            lobby.close()
    hold = (meeting, m.server) if host == m.rank else (meeting,)
    try:
        return core, arm(core, addr, m.token, m.options, hold, lobby=m.lobby, alive=alive(meeting))
    except BaseException:
        core.close()
        raise


class _GrowMeeting(MeetingStore):
    """The meeting store of a grow: it knows where the members' standby stores are, and
    a newcomer's once it has taken its seat (the seat names it), so that a rank whose
    process is gone is named at once while the grown communicator is made."""

    def __init__(self, store: Any, hosted_here: bool, members: List[Any], prefix: str):
        super().__init__(store, hosted_here, [(str(a), int(p)) for a, p in members])
        self._prefix = prefix
        self._seats: Dict[int, Tuple[str, int]] = {}

    def peer_gone(self, rank: int) -> bool:
        if rank < len(self._members):
            return super().peer_gone(rank)
        where = self._seats.get(rank)
        if where is None:
            seat = self._store.try_get(f"{self._prefix}/seat/{rank}")
            parts = seat.decode().split() if seat is not None else []
            if len(parts) != 3:
                return False  # not seated yet: nothing known about it
            where = self._seats[rank] = (parts[1], int(parts[2]))
        return refused(where)


def _explained(exc: RingReduceError, store: Any, prefix: str, host: int, rank: int) -> Exception:
    """The error a member raises when the grown communicator could not be made. The host
    waited for every newcomer and knows who did not come; the others, who waited for
    the host, raise its reason when it gives one soon."""
    key = prefix + "/failed"
    try:
        if rank == host:
            store.set(key, str(exc).encode())
            return exc
        give_up = time.monotonic() + 2.0
        while time.monotonic() < give_up:
            why = store.try_get(key)
            if why is not None:
                told = type(exc)(f"rank {rank}: the grow failed at rank {host}: {why.decode()}")
                told.peer = getattr(exc, "peer", None)
                return told
            time.sleep(_POLL)
    except RingReduceError:
        pass  # the host's store is gone too: our own error is all we know
    return exc


def _open_lobby(
    m: Membership, store: Any, prefix: str, size: int, timeout: float, host: int
) -> Any:
    """On the lobby's server: serves the lobby at the job's address, pointing to rank
    ``host``'s standby store, and says so there (or says why not, so that the other
    members fail at once instead of waiting)."""
    addr, port = m.lobby
    lobby = None
    try:
        lobby = _core.TcpStore(addr, port, True, timeout, min(timeout, 5.0), m.token)
        standby = m.addresses[host]
        info = {
            "standby": [standby[0], standby[1]],
            "prefix": prefix,
            "old": m.size,
            "new": size,
            "transport": m.options.transport,
            "timeout": float(m.options.timeout_seconds),
            "members": [[a, p] for a, p in m.addresses],
        }
        lobby.set(_LOBBY_KEY, json.dumps(info).encode())
    except BaseException as exc:
        why = (
            f"rank {m.rank} could not open the lobby for newcomers at {addr}:{port} "
            f"(the job's rendezvous address): {exc}"
        )
        store.set(prefix + "/lobby", ("error: " + why).encode())
        if lobby is not None:
            lobby.close()
        if isinstance(exc, RingReduceError):
            raise RingReduceError(why) from exc
        raise
    store.set(prefix + "/lobby", b"open")
    return lobby


def _await_lobby(store: Any, prefix: str, deadline: float, server: int, rank: int) -> None:
    while True:
        # The host's standby store answers the moment the lobby's state is set.
        state = held_get(store, prefix + "/lobby", _HELD, deadline)
        if state is not None:
            if state != b"open":
                raise RingReduceError(f"rank {rank}: {state.decode()[len('error: ') :]}")
            return
        if time.monotonic() >= deadline:
            exc = TimeoutError(f"rank {rank}: rank {server} did not open the lobby in time")
            exc.peer = server
            raise exc


def join(
    timeout: Optional[float] = None,
    *,
    master_addr: Optional[str] = None,
    master_port: Optional[int] = None,
    token: str = "",
) -> Tuple[Any, Membership]:
    """In a newcomer: waits (up to ``timeout``) for the members' grow, takes the next free
    rank. (the engine's communicator, its Membership)."""
    timeout = 60.0 if timeout is None else float(timeout)
    if timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    deadline = time.monotonic() + timeout
    host, port = _env.master_address(master_addr, master_port)
    secret = token
    full: Set[str] = set()  # grows whose new ranks other newcomers took
    # Our standby store first: the seat we take names it, so that the members see at
    # once if we die while the grown communicator is made.
    server, advertise = standby_server(host, timeout, secret)
    try:
        while True:
            info = _read_lobby(host, port, secret, timeout, deadline, full)
            options = _env.engine_options(info["transport"], info["timeout"])
            options.token = secret
            # The host's standby store is where the grown communicator is made: a
            # partition of its machine is named at the keepalive, as for the members.
            standby = _core.TcpStore(
                info["standby"][0],
                int(info["standby"][1]),
                False,
                _left(deadline),
                5.0,
                secret,
                options.tcp_keepalive_seconds,
            )
            rank = _take_seat(standby, info, f"{advertise} {server.port}")
            if rank is not None:
                break
            standby.close()
            full.add(info["prefix"])  # wait for the next grow
        meeting = _GrowMeeting(standby, False, info.get("members", []), info["prefix"])
        core = _core.Communicator.create_with_store(
            meeting,
            rank,
            int(info["new"]),
            _advertise(info["standby"][0]),
            info["prefix"],
            options,
        )
    except BaseException:
        server.close()
        raise
    try:
        membership = arm(
            core,
            host,
            secret,
            options,
            (meeting,),
            lobby=(host, port),
            alive=alive(meeting),
            standby=(server, advertise),
        )
    except BaseException:
        core.close()
        raise
    return core, membership


def _read_lobby(
    host: str, port: int, token: str, timeout: float, deadline: float, full: Set[str]
) -> Dict:
    """The lobby's directions, waiting for the members to open it (connection refused
    until then) and skipping grows already full."""
    last: Optional[BaseException] = None
    while time.monotonic() < deadline:
        try:
            lobby = _core.TcpStore(host, port, False, min(1.0, _left(deadline)), 5.0, token)
        except RingReduceError as exc:
            if type(exc).__name__ == "AuthenticationError":
                raise
            last = exc
            time.sleep(0.05)
            continue
        try:
            # Not a lobby (yet): the rendezvous store of the members' first meeting, which
            # accepts connections until every member is in. Look again soon.
            give_up = min(deadline, time.monotonic() + 0.5)
            while time.monotonic() < give_up:
                value = lobby.try_get(_LOBBY_KEY)
                if value is not None and json.loads(value)["prefix"] not in full:
                    return json.loads(value)
                time.sleep(_POLL)
        except RingReduceError as exc:  # the lobby closed: a grow ended without us
            last = exc
        finally:
            lobby.close()
    raise TimeoutError(
        f"join: no grow with a free rank opened a lobby at {host}:{port} within {timeout:g} s"
        + (f" (last: {last})" if last else "")
    )


def _take_seat(store: Any, info: Dict, standby: str) -> Optional[int]:
    """The first free rank of the grown communicator, its seat naming our standby store
    ("address port"); None when others took them all."""
    nonce = f"{os.urandom(8).hex()} {standby}".encode()
    for rank in range(int(info["old"]), int(info["new"])):
        if store.set_if_absent(f"{info['prefix']}/seat/{rank}", nonce) == nonce:
            return rank
    return None


def _advertise(addr: str) -> str:
    return _core.local_ip_towards(addr) if addr not in ("127.0.0.1", "localhost") else ""


def _left(deadline: float) -> float:
    return max(0.05, deadline - time.monotonic())
