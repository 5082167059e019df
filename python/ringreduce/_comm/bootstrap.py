"""Joining a job: `init()` and the choice of transport.

Where rank, world size and the rendezvous come from is read here, once, from the
arguments and the launcher's environment (`_env`), and handed to the engine as
values.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Callable, Optional

from .. import _core, _env
from .._env import engine_options, launched_by_mpirun, master_address, rank_and_size
from . import mpi
from .communicator import Communicator
from .membership import agreement as membership
from .membership import growth
from .membership.agreement import Membership

__all__ = ["init"]

_log = logging.getLogger("ringreduce")

# Whatever starts the ranks can let rank 0 listen on a port the kernel picks, rather
# than probe for a free one that another program may take first: it sets this to a
# callable, and rank 0 calls init(master_port=0). The callable gets the port before
# rank 0 waits for the others, and passes it on to them (tests/_ranks.py does).
port_ready: Optional[Callable[[int], None]] = None


def init(
    transport: str = "auto",
    *,
    rank: Optional[int] = None,
    world_size: Optional[int] = None,
    master_addr: Optional[str] = None,
    master_port: Optional[int] = None,
    timeout: float = 60.0,
    store_dir: Optional[str] = None,
    token: Optional[str] = None,
) -> Communicator:
    """Joins the job and returns its communicator.

    rank/world_size default to the launcher's environment (RANK/WORLD_SIZE,
    OMPI_COMM_WORLD_*, PMI_*, SLURM_*); MASTER_ADDR/MASTER_PORT locate rank 0's
    rendezvous store (``store_dir``: use a shared directory instead). ``timeout``
    bounds every wait on a peer, in seconds.

    ``transport`` says which links carry the data:

    - "auto" (default; the RINGREDUCE_TRANSPORT variable overrides it): shared memory
      between the ranks of one host, and between hosts MPI when launched by mpirun
      and MPI support loads, else TCP. ``comm.transport`` then reads "shm",
      "shm+tcp", "shm+mpi", "tcp" or "mpi".
    - "tcp", "mpi" (MPI_COMM_WORLD; needs the MPI build): every link.
    - "shm": shared memory only; every rank must be on this host.

    Under mpirun without MASTER_ADDR, the socket-based transports meet over MPI
    (mpi4py): rank 0 picks the address, a free port and a random job token.

    ``token`` (default: the RINGREDUCE_TOKEN variable; ``ringreduce launch`` sets a
    random one for its ranks) is the job's secret: every connection to the rendezvous
    store and every TCP link between ranks proves it holds the same token (HMAC
    challenge-response; the token itself never goes on the wire). A process with a
    missing or different token gets :class:`ringreduce.AuthenticationError` and the
    job is not disturbed. Without a token anyone who reaches the store's port can
    join; it then listens on loopback only when MASTER_ADDR is a loopback address.
    """
    env_transport = _env.transport_setting()
    if transport == "auto" and env_transport:
        transport = env_transport
    if transport not in ("auto", "tcp", "mpi", "shm"):
        raise ValueError(f"transport must be 'auto', 'tcp', 'mpi' or 'shm', got {transport!r}")
    if not timeout or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")

    over_mpi = transport == "mpi" or (
        transport == "auto" and launched_by_mpirun() and mpi.available()
    )
    if transport == "auto" and launched_by_mpirun() and not over_mpi:
        _log.warning(
            "ringreduce: launched by mpirun, but MPI support is not available (%s); ranks "
            "meet over TCP and use shared memory on a host, TCP between hosts",
            mpi.unavailable_reason(),
        )
    if over_mpi:
        # MPI knows every rank: no rendezvous. rank/world_size, if given, must agree.
        # MPI authenticates its own ranks; a token (if any) is not needed there.
        core = mpi.create_world(engine_options(transport, timeout))
        comm = Communicator(core, membership=_arm_over_mpi(core, timeout))
        mpi.track(comm)
        mine = (comm.rank, comm.world_size)
        if any(v is not None and int(v) != m for v, m in zip((rank, world_size), mine)):
            comm.close()
            raise ValueError(
                f"rank={rank}, world_size={world_size} disagree with MPI_COMM_WORLD "
                f"(rank {comm.rank} of {comm.world_size}); leave them out with transport='mpi'"
            )
        return comm
    options = engine_options(transport, timeout)
    options.token = _token(token)
    r, n = rank_and_size(rank, world_size)
    if n < 1 or not 0 <= r < n:
        raise ValueError(f"rank {r} is not in [0, world_size={n})")
    if (
        master_addr is None
        and _env.master_addr() is None
        and not store_dir
        and rank is None
        and world_size is None
        and n > 1
        and launched_by_mpirun()
        and mpi.have_mpi4py()
    ):
        # Under mpirun without MASTER_ADDR: agree on rank 0's address over MPI.
        from mpi4py import MPI

        core = mpi.create_tcp(MPI.COMM_WORLD, options, master_port)
        # Ranks may be on several hosts: standby stores listen on this host's address.
        here = _env.master_addr() or socket.gethostbyname(socket.gethostname())
        return Communicator(core, membership=_arm(core, here, options))
    report = port_ready if r == 0 and not store_dir else None
    host, port = master_address(master_addr, master_port, any_port=report is not None)
    chosen = [port]

    def ready(p: int) -> None:
        chosen[0] = p  # where newcomers will look (grow)
        if report is not None:
            report(p)

    core = _core.Communicator.create_tcp(
        r, n, host, port, store_dir or "", options, ready if port == 0 else None
    )
    lobby = None if store_dir else (host, chosen[0])
    return Communicator(core, membership=_arm(core, "" if store_dir else host, options, lobby))


def join(
    timeout: Optional[float] = None,
    *,
    master_addr: Optional[str] = None,
    master_port: Optional[int] = None,
    token: Optional[str] = None,
) -> Communicator:
    """Joins a running job as a newcomer: waits up to ``timeout`` (default 60 s) for its
    members to call ``comm.grow(world_size)``, then returns the grown communicator, in
    which this process has one of the new ranks (``comm.rank``).

    The job is found as ``init`` finds it: MASTER_ADDR/MASTER_PORT (or the arguments),
    and the token (``token``, else RINGREDUCE_TOKEN). A wrong token raises
    AuthenticationError here and leaves the job undisturbed.
    """
    core, joined = growth.join(
        timeout, master_addr=master_addr, master_port=master_port, token=_token(token)
    )
    return Communicator(core, membership=joined)


def _arm(core: object, host: str, options: object, lobby: object = None) -> Membership:
    """The communicator's standby stores (see `membership`); closes core if that fails."""
    try:
        return membership.arm(core, host, options.token, options, lobby=lobby)
    except BaseException:
        core.close()
        raise


def _arm_over_mpi(core: object, timeout: float) -> Optional[Membership]:
    """Standby stores for a communicator over MPI, so that survivors of a dead rank can
    shrink onto the job's own shared-memory and TCP links (MPI itself cannot go on with
    a dead rank without ULFM). Their token is a random one rank 0 draws and sends over
    MPI; they listen on this host's address when the job spans hosts."""
    here = _env.master_addr() or "127.0.0.1"
    if core.local_world_size != core.world_size and here.startswith("127."):
        here = socket.gethostbyname(socket.gethostname())
    options = engine_options("auto", timeout)
    if core.rank == 0:
        core.publish("standby-token", os.urandom(16).hex().encode())
    options.token = core.fetch("standby-token", timeout).decode()
    return _arm(core, here, options)


def _token(token: Optional[str]) -> str:
    """The job token: the argument, else RINGREDUCE_TOKEN, else none ("")."""
    if token is None:
        token = _env.token()
    if not isinstance(token, str):
        raise TypeError(f"token must be a str, got {type(token).__name__}")
    if token and not token.isprintable():
        raise ValueError("token must be printable text (RINGREDUCE_TOKEN)")
    return token
