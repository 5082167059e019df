"""Surviving a dead rank: revoke, agree and shrink, with no service outside the job.

Every rank of a communicator made by ``init`` over sockets or shared memory serves a
*standby store* (a TCP store on a free port, holding the job's token) and
knows every other rank's, read once at init while the rendezvous store still lives. When
a rank dies, the communicator is *revoked*: its calls raise `PeerError` naming the ranks
known to be dead. The survivors then meet on the standby store of the lowest rank they
believe alive, so the job goes on when rank 0, the host of the rendezvous store, is the
one that died:

- ``agree``: each survivor checks in there with its flag and the ranks it knows to be
  dead. That rank (the *host*) waits until every rank not known dead has checked in;
  a rank whose standby port refuses connections is dead (its process is gone), and a
  rank that has not checked in by the deadline is counted dead too. The host writes one
  decision: the members, the AND of their flags, the dead. Everyone reads the same one.
  A host that dies before deciding is counted dead and the next lowest takes over.
  A rank whose machine stopped answering TCP keepalive probes (a partition, a frozen
  host) is *unreachable*: the survivors skip it as a host and the host counts it dead
  without the wait a merely suspected rank gets.
  Only a rank whose process is proven gone (its standby port refuses connections, or
  this machine sees it stopped) cannot be meeting elsewhere; the others counted dead
  (unreachable, or silent) may be alive on the other side of a network partition. So
  the members go on only as the majority of the old world's live part: more members
  than such ranks, or as many and the lowest rank of them all. Otherwise every member
  raises `PeerError` (a minority): the two sides of a partition never both go on.
- ``shrink``: an agreement, then a new communicator of the members, ranks renumbered in
  the old order, meeting through the host's standby store (same transport and token).

Newcomers join through ``growth`` (grow/join). Communicators that ``init`` makes over
MPI are armed too, and shrink onto shared memory and TCP (`bootstrap`). What it is not
(yet): links to live ranks are rebuilt too, not only those that touched the dead;
``Communicator.from_mpi`` communicators are not armed.
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable, Dict, FrozenSet, List, Optional, Set, Tuple

from ... import _core
from ...errors import PeerError, RingReduceError, TimeoutError
from . import processes
from .arming import fetch_all_named as _fetch_all
from .arming import on_this_machine as _on_this_machine
from .arming import standby_server
from .arming import standby_table as _standby_table
from .meeting import MeetingStore, alive, held_get, probe, refused, silent_throughout

__all__ = ["Membership", "arm"]


_HELD = 0.05  # seconds the host's store may hold a wait for the decision
_PROBE_EVERY = 0.05  # seconds between connection probes of a missing rank's standby port
_SHRINK_ATTEMPTS = 3  # agreements + makings of a shrunk communicator, when members die meanwhile
_CONNECT_SECONDS = 2.0  # at most, to reach a host's standby store before counting it dead
_LOOK_ELSEWHERE = 0.2  # seconds a rank may be missing before the host looks for its decision
_DECISIONS_KEPT = 16  # rounds whose decision the host's store keeps (for late readers)
# Whether a shrink takes over the TCP links its communicator parked (bench/fault_drill.py
# --fresh-links turns it off, to measure what that saves).
_REUSE_LINKS = True


class Membership:
    """One rank's view of who is alive in one communicator, and its standby store."""

    def __init__(
        self,
        core: Any,
        server: Any,
        addresses: List[Tuple[str, int]],
        token: str,
        options: Any,
        hold: tuple = (),
        lobby: Optional[Tuple[str, int]] = None,
        lobby_ranks: FrozenSet[int] = frozenset(),
        procs: Tuple[Optional[processes.Process], ...] = (),
    ):
        self._core = core
        self.rank = int(core.rank)
        self.size = int(core.world_size)
        self.id = str(core.id)
        self.server = server  # this rank's standby store (served here)
        self.addresses = addresses  # every rank's standby store, by rank
        self.token = token
        self.options = options
        self.failed: Set[int] = set()  # known or suspected dead (a peer blamed by an error)
        self.gone: Set[int] = set()  # proven dead: agreed on, or its standby store unreachable
        # Its machine answered no keepalive probe: not a live rank blamed wrongly.
        self.unreachable: Set[int] = set()
        self.rounds = 0  # agreements completed on this communicator
        self._connect_seconds = _CONNECT_SECONDS
        self._silent_since: Dict[int, float] = {}  # candidate hosts silent, in this agreement
        self._hold = hold  # stores a communicator made by shrink meets through
        self.lobby = lobby  # the job's rendezvous address, where newcomers look (growth)
        self.lobby_ranks = lobby_ranks  # the ranks on that address's machine (can serve it)
        self.processes = procs  # every rank's process, where published (None: not)

    # -- revocation -----------------------------------------------------------------
    def note(self, exc: BaseException) -> None:
        """A call failed with exc and the communicator is revoked: a peer blamed for a
        death, a departure or a silence is (suspected) dead."""
        peer = getattr(exc, "peer", None)
        if isinstance(exc, (PeerError, TimeoutError)) and peer is not None and peer != self.rank:
            self.failed.add(int(peer))
            if isinstance(exc, PeerError) and exc.reason == "unreachable":
                self.unreachable.add(int(peer))

    def halted(self, rank: int) -> bool:
        """True when rank's process, on this machine, is stopped or gone, and this
        communicator is revoked: a stopped rank makes no progress until resumed, and a
        revoked communicator is past waiting for it (a healthy one's ``agree`` still
        waits for it, as for any slow rank)."""
        return bool(self._core.failure) and processes.halted(self._process(rank))

    def _process(self, rank: int) -> Optional[processes.Process]:
        return self.processes[rank] if 0 <= rank < len(self.processes) else None

    # -- agreement -------------------------------------------------------------------
    def agree(self, flag: bool, timeout: float) -> Dict[str, Any]:
        """The decision of one agreement (see the module's docstring), with ``store``:
        the host's standby store it was made on."""
        deadline = time.monotonic() + timeout
        # Reaching a stopped host, then a late suspect, may take this long each: a
        # quarter of the timeout at most, so that members still wait for the decision.
        self._connect_seconds = min(_CONNECT_SECONDS, timeout / 4)
        self._silent_since = {}
        seq = self.rounds
        while True:
            # The host is the lowest rank not proven dead; a rank only suspected (an error
            # may blame a live neighbour when the store's host died) is tried first, so
            # that every survivor reaches the same host.
            host = next(r for r in range(self.size) if r not in self.gone)
            if host != self.rank and host not in self.unreachable and self._silent(host, deadline):
                continue
            # Unreachable: trying its standby store would only wait out the connect.
            store = None if host in self.unreachable else self._connect(host, deadline)
            if store is None:
                self.failed.add(host)
                self.gone.add(host)
                continue
            key = f"{self.id}agree/{seq}/{host}/"
            try:
                mine = {
                    "flag": bool(flag),
                    "failed": sorted(self.failed),
                    "unreachable": sorted(self.unreachable),
                }
                store.set(f"{key}in/{self.rank}", json.dumps(mine).encode())
                if host == self.rank:
                    self._decide(store, key, deadline)
                decision = self._await(store, key + "decision", deadline, host)
            except PeerError:
                if host == self.rank:
                    raise
                self.failed.add(host)  # the host died before deciding: the next one takes over
                self.gone.add(host)
                continue
            self.failed = set(decision["failed"])
            self.gone = set(decision["failed"])
            self.rounds += 1
            if not decision.get("majority", True):
                elsewhere = decision.get("elsewhere", [])
                raise PeerError(
                    f"rank {self.rank}: no majority on communicator {self.id!r}: "
                    f"{len(decision['members'])} rank(s) {decision['members']} reached the "
                    f"agreement, and rank(s) {elsewhere} may be alive on the other side of "
                    "a network partition (their machines answered nothing, or they stayed "
                    "silent; none is proven gone). Going on would split the job in two: "
                    "the side with more ranks (at a tie, the one with the lowest) goes on"
                )
            if self.rank not in decision["members"]:
                raise PeerError(
                    f"rank {self.rank}: left out of the agreement on communicator "
                    f"{self.id!r}: rank {host} did not count it alive (it checked in late, "
                    "or another rank reported it dead)"
                )
            decision["store"] = store
            decision["host"] = host
            return decision

    def _silent(self, host: int, deadline: float) -> bool:
        """When ``host``'s machine answers no connection (cut off, or down): waits out the
        connect for it and every other candidate host below this rank at once, one
        connect time in all, not one each (a cut-off rank learns it is a minority as
        soon whatever its rank), and counts those silent throughout dead, noting since
        when for the agreement this rank may then host. Whether ``host`` was one."""
        start = time.monotonic()
        if self.halted(host) or probe(self.addresses[host]) != "silent":
            return False
        lower = [r for r in range(host, self.rank) if r not in self.gone | self.unreachable]
        left = max(0.05, min(deadline - time.monotonic(), self._connect_seconds))
        for r in silent_throughout({r: self.addresses[r] for r in lower}, left):
            self.failed.add(r)
            self.gone.add(r)
            self._silent_since[r] = start
        return host in self.gone

    def _decide(self, store: Any, key: str, deadline: float) -> None:
        """On the host: waits for every rank not known dead, then writes the decision.

        A rank some survivor reports dead is only suspected: a survivor may blame the
        wrong rank (a neighbour that closed its links when the store's host died). It is
        waited for until every unsuspected rank is in, and kept if it checked in."""
        reports: Dict[int, dict] = {}
        suspected = set(self.failed)
        unreachable = set(self.unreachable)
        dead: Set[int] = set()
        proven: Set[int] = set()  # dead for certain: its process is gone or stopped
        probed: Dict[int, float] = {}
        # Since when its machine answers no connection (counted from before this rank came
        # to host, if it found it silent as a candidate host): for the keepalive time, and
        # it is unreachable (a rank no link named, e.g. one only sent to across a partition).
        silent_since: Dict[int, float] = dict(self._silent_since)
        silent_limit = float(self.options.tcp_keepalive_seconds or _CONNECT_SECONDS)
        looked: Set[int] = set()  # missing ranks whose store was searched for a decision
        started = time.monotonic()
        all_in: Optional[float] = None  # when every unsuspected rank had checked in
        while True:
            out = [r for r in range(self.size) if r not in reports]
            for r, value in zip(out, store.try_get_many([f"{key}in/{r}" for r in out])):
                if value is not None:
                    reports[r] = json.loads(value)
                    suspected.update(int(d) for d in reports[r]["failed"])
                    unreachable.update(int(d) for d in reports[r].get("unreachable", ()))
            now = time.monotonic()
            for r in range(self.size):
                if r in reports or r in dead or now - probed.get(r, 0.0) < _PROBE_EVERY:
                    continue
                if r in unreachable:
                    continue  # a probe of a machine that answers nothing only waits
                probed[r] = now
                answer = probe(self.addresses[r])
                if answer == "refused" or self.halted(r):
                    dead.add(r)  # its process is gone (nothing listens on its port) or stopped
                    proven.add(r)
                elif answer == "silent":
                    if now - silent_since.setdefault(r, now) >= silent_limit:
                        unreachable.add(r)
                        suspected.add(r)
                else:
                    silent_since.pop(r, None)
                    if r not in looked and now - started >= _LOOK_ELSEWHERE:
                        looked.add(r)
                        self._not_left_out(r, deadline)
            missing = [r for r in range(self.size) if r not in reports and r not in dead]
            if all(r in suspected for r in missing):
                # Everyone not suspected is in. A suspected rank may be a live one that a
                # survivor blamed wrongly and that is still on its way: give it as long as
                # reaching a host may take before counting it dead. Not one whose machine
                # answered no keepalive probe: nobody blamed it for a neighbour's fault.
                all_in = now if all_in is None else all_in
                waited = now - all_in >= 1.25 * self._connect_seconds
                if not missing or waited or all(r in unreachable for r in missing):
                    dead.update(missing)
                    break
            if now >= deadline:
                dead.update(missing)  # silent past the deadline: counted dead
                break
            # Wait for the first missing rank's check-in (an unsuspected one first): the
            # store answers the moment it is in, and whoever else came meanwhile is read
            # by the next look.
            wanted = [r for r in missing if r not in suspected] or missing
            held_get(store, f"{key}in/{wanted[0]}", _PROBE_EVERY, deadline)
        members = sorted(r for r in reports if r not in dead)
        # Quorum: those not proven gone may be meeting on the other side of a partition.
        elsewhere = sorted(dead - proven)
        ahead = len(members) > len(elsewhere)
        tie = len(members) == len(elsewhere) and min(members + elsewhere) in members
        decision = {
            "members": members,
            "flag": all(reports[r]["flag"] for r in members),
            "failed": sorted(dead),
            "elsewhere": elsewhere,
            "majority": ahead or tie,
        }
        store.set(key + "decision", json.dumps(decision).encode())
        self._forget(key, seq=self.rounds)

    def _forget(self, key: str, seq: int) -> None:
        """On the host, round ``seq`` decided: drops what no one will read, so that agreeing
        every step does not grow the store. Check-ins are read only to decide; a decision
        also by a rank stopped in its round, once resumed: kept `_DECISIONS_KEPT` rounds."""
        self.server.erase_prefix(f"{key}in/")
        if seq >= _DECISIONS_KEPT:
            self.server.erase_prefix(f"{self.id}agree/{seq - _DECISIONS_KEPT}/")

    def _not_left_out(self, r: int, deadline: float) -> None:
        """Raises PeerError when rank r, still alive, decided this round already as its
        host, without this rank. This rank is then one the others counted dead (stopped
        or too late, and resumed since), and it hosts this agreement only because it is
        the lowest: it must not go on as a communicator of its own. (A rank that is not
        the lowest finds the others' decision on their host's store.)"""
        store = self._connect(r, deadline)  # None: gone or stopped
        if store is None:
            return
        try:
            value = store.try_get(f"{self.id}agree/{self.rounds}/{r}/decision")
        except RingReduceError:
            return
        finally:
            store.close()
        if value is not None and self.rank not in json.loads(value)["members"]:
            raise PeerError(
                f"rank {self.rank}: left out of the agreement on communicator {self.id!r}: "
                f"the other ranks agreed without it on rank {r} (they counted it dead: "
                "stopped, or too late) and went on"
            )

    def _await(self, store: Any, key: str, deadline: float, host: int) -> Dict[str, Any]:
        while True:
            if host != self.rank and self.halted(host):  # its store would not answer
                raise PeerError(f"rank {host}, the agreement's host, is stopped or gone")
            # The host's store holds the request until the decision is written.
            try:
                value = held_get(store, key, _HELD, deadline)
            except RingReduceError as exc:
                raise PeerError(f"rank {host}'s standby store went away: {exc}") from exc
            if value is not None:
                return json.loads(value)
            if time.monotonic() >= deadline:
                exc = TimeoutError(
                    f"rank {self.rank}: no agreement from rank {host} within the timeout "
                    f"(communicator {self.id!r})"
                )
                exc.peer = host
                raise exc

    def _connect(self, host: int, deadline: float) -> Optional[Any]:
        """A client of rank host's standby store, or None when its process is gone."""
        address = self.addresses[host]
        if host != self.rank and (self.halted(host) or refused(address)):
            return None
        # A stopped process accepts connections, never answers: one bounded wait everywhere.
        left = max(0.05, min(deadline - time.monotonic(), self._connect_seconds))
        try:
            store = _core.TcpStore(
                address[0],
                address[1],
                False,
                left,
                5.0,
                self.token,
                self.options.tcp_keepalive_seconds,
            )
        except RingReduceError:
            if host == self.rank:
                raise
            return None
        if host != self.rank and self._core.failure:
            # Revoked: a host stopped while it holds a request of ours (a wait for the
            # decision, or for a key of the communicator being made) fails that request
            # within moments, as halted() fails the next one.
            store.set_host_stop_check(True)
        return store

    # -- shrink ----------------------------------------------------------------------
    def shrink(self, timeout: float) -> Tuple[Any, Membership]:
        """(the engine's communicator of the members, its Membership).

        A member that dies after the agreement, while the new communicator is being
        made, fails that making on every member (the one waiting for it names it; the
        others may name the host they were waiting for): they all count the rank named
        dead, agree again (which keeps a live rank named wrongly, since it checks in)
        and make the communicator of the new members: up to three attempts, each
        bounded by ``timeout`` (the agreement) and the communicator's timeout (the
        making)."""
        for attempt in range(_SHRINK_ATTEMPTS):
            decision = self.agree(True, timeout)
            members, store, host = decision["members"], decision["store"], decision["host"]
            meeting = f"{self.id}shrink/{self.rounds}/{host}"
            addr = self.addresses[host][0]
            local = addr in ("127.0.0.1", "localhost")
            advertise = "" if local else _core.local_ip_towards(addr)
            # A member that dies while the communicator is made fails the making at
            # once, named: its standby store no longer accepts connections.
            olds = [self.addresses[m] for m in members]
            # Members stopped meanwhile are gone for the making only when a failure
            # revoked this communicator: a healthy one's shrink waits for a paused rank.
            procs = [self._process(m) for m in members] if self._core.failure else []
            meeting_store = MeetingStore(store, host == self.rank, olds, procs)
            hold = (meeting_store, self.server) if host == self.rank else (meeting_store,)
            core = None
            try:
                # The TCP ring takes over the links this one parked between ranks
                # that stay neighbours; only links that touched the dead are made anew.
                core = _core.Communicator.create_with_store(
                    meeting_store,
                    members.index(self.rank),
                    len(members),
                    advertise,
                    meeting,
                    self.options,
                    parent=self._core if _REUSE_LINKS else None,
                    old_ranks=members,
                )
                armed = arm(
                    core,
                    addr,
                    self.token,
                    self.options,
                    hold,
                    lobby=self.lobby,
                    alive=alive(meeting_store),
                )
                self._core.release_links()  # what the new one did not take over
                return core, armed
            except (PeerError, TimeoutError) as exc:
                if core is not None:
                    core.abort()
                    core.close()
                peer = getattr(exc, "peer", None)
                if peer is None or not 0 <= peer < len(members) or attempt + 1 == _SHRINK_ATTEMPTS:
                    raise
                if members[peer] == self.rank:
                    raise
                self.failed.add(members[peer])  # suspected: the next agreement decides
                continue
        raise AssertionError("unreachable: the last attempt raises")


def arm(
    core: Any,
    host: str,
    token: str,
    options: Any,
    hold: tuple = (),
    lobby: Optional[Tuple[str, int]] = None,
    alive: Optional[Callable[[int], bool]] = None,
    standby: Optional[Tuple[Any, str]] = None,
) -> Membership:
    """Starts this rank's standby store and reads every rank's address of theirs (a
    collective over the rendezvous store: every rank calls it). ``lobby``: the job's
    rendezvous address, where newcomers look for a grow (None: they cannot); each rank
    says whether it is on that address's machine, where it could serve them.
    ``alive(r)``: whether rank r's process is still there (False: proven gone), asked
    while its keys are awaited, so that a death is a PeerError naming it at once, not a
    TimeoutError at the timeout (None: the timeout). ``standby``: this rank's standby
    store and its address, when it was started already (`standby_server`); closed here
    if arming fails, as one started here is."""
    timeout = float(core.timeout)
    server, advertise = standby if standby is not None else standby_server(host, timeout, token)
    try:
        rank, size = int(core.rank), int(core.world_size)
        here = 1 if _on_this_machine(lobby) else 0
        entry = f"{advertise} {server.port} {here} {processes.mine()}".strip()
        core.publish(f"standby/{rank}", entry.encode())
        addresses, lobby_ranks, procs = [], set(), []
        for r, entry in enumerate(_standby_table(core, rank, size, timeout, alive)):
            name, port, there, *proc = entry.split()
            addresses.append((name, int(port)))
            procs.append(processes.parse(proc))
            if there == "1":
                lobby_ranks.add(r)
        # Rank 0 serves the rendezvous store (or, after a shrink, the meeting store) and
        # takes it away when it closes: it returns only once every rank has read what it
        # needs here, so that a communicator closed as soon as it is made does not fail
        # another rank's init.
        core.publish(f"armed/{rank}", b"1")
        if rank == 0:
            _fetch_all(core, [f"armed/{r}" for r in range(1, size)], range(1, size), timeout, alive)
    except BaseException:
        server.close()
        raise
    return Membership(
        core, server, addresses, token, options, hold, lobby, frozenset(lobby_ranks), tuple(procs)
    )
