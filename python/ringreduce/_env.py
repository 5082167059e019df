"""The one reader of the environment: where rank and world size come from, for each
launcher we know, and the RINGREDUCE_* settings. Other modules ask here, and the engine
gets the settings as Options (csrc/engine/options.h, whose defaults are the only ones:
they are read from a default-made ``_core.Options``).
"""

from __future__ import annotations

import os
from typing import Any, Optional, Tuple

from . import _core

# (rank variable, size variable), in the order they are trusted.
_LAUNCHERS = (
    ("RANK", "WORLD_SIZE"),  # ringreduce launch, torchrun
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),  # Open MPI
    ("PMI_RANK", "PMI_SIZE"),  # MPICH, Intel MPI
    ("PMIX_RANK", "PMIX_SIZE"),
    ("SLURM_PROCID", "SLURM_NTASKS"),  # srun
)


# Variables an MPI launcher sets for each process it starts, which RANK/WORLD_SIZE set by
# hand must agree with. (Not SLURM's: they describe the allocation or job step, and are
# inherited by whatever a batch script starts, so they may differ legitimately.)
_MPI_LAUNCHERS = _LAUNCHERS[1:4]
# Set by per-host launchers (torchrun, ringreduce launch) along with RANK/WORLD_SIZE: the
# ranks are theirs, and an outer launcher's variables (mpirun, srun) describe the
# launcher processes instead.
_LOCAL_LAUNCHER_VAR = "LOCAL_WORLD_SIZE"


def _env_int(name: str) -> int:
    text = os.environ[name]
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{name} must be a whole number, got {text!r}") from None


def _checked(rank: int, size: int, rank_from: str, size_from: str) -> Tuple[int, int]:
    if size < 1:
        raise ValueError(f"{size_from} must be >= 1")
    if not 0 <= rank < size:
        raise ValueError(f"{rank_from} is not a rank of {size_from}: it must be in [0, {size})")
    return rank, size


def rank_and_size(rank: Optional[int], world_size: Optional[int]) -> Tuple[int, int]:
    """Fills in rank/world size from the environment where the caller gave none.

    ValueError naming the variables for a partial or inconsistent environment: half of
    RANK/WORLD_SIZE, values that are not whole numbers or out of range, and RANK/WORLD_SIZE
    that disagree with the MPI launcher that started this process.
    """
    if rank is not None and world_size is not None:
        return int(rank), int(world_size)
    # Half of RANK/WORLD_SIZE is a mistake that a world of one would hide. (Only this
    # pair, which people set by hand: schedulers may set half of theirs legitimately.)
    if ("RANK" in os.environ) != ("WORLD_SIZE" in os.environ):
        there, missing = ("RANK", "WORLD_SIZE") if "RANK" in os.environ else ("WORLD_SIZE", "RANK")
        raise ValueError(
            f"{there}={os.environ[there]} is set but {missing} is not: set both (or "
            "neither), or pass rank= and world_size= to init()"
        )
    for rank_var, size_var in _LAUNCHERS:
        if rank_var in os.environ and size_var in os.environ:
            if rank is None and world_size is None:
                r, s = _env_int(rank_var), _env_int(size_var)
                _checked(r, s, f"{rank_var}={r}", f"{size_var}={s}")
                if rank_var == "RANK":
                    _agree_with_mpi_launcher(r, s)
                return r, s
            if rank is None:  # world_size given: the environment's rank in it
                r = _env_int(rank_var)
                return _checked(r, int(world_size), f"{rank_var}={r}", f"world_size={world_size}")
            s = _env_int(size_var)
            return _checked(int(rank), s, f"rank={rank}", f"{size_var}={s}")
    if rank is None and world_size is None:
        return 0, 1  # a plain `python script.py`: a world of one
    raise ValueError(
        "rank and world_size must both be given, or both come from the environment "
        "(RANK/WORLD_SIZE, OMPI_COMM_WORLD_RANK/_SIZE, PMI_RANK/PMI_SIZE, "
        "SLURM_PROCID/SLURM_NTASKS)"
    )


def _agree_with_mpi_launcher(rank: int, size: int) -> None:
    """RANK/WORLD_SIZE set by hand in a process an MPI launcher started must be that
    launcher's: a copied WORLD_SIZE, or one RANK exported to every process, would
    otherwise make ranks wait for peers that never come, or two ranks claim one place."""
    if _LOCAL_LAUNCHER_VAR in os.environ:
        return
    for rank_var, size_var in _MPI_LAUNCHERS:
        if rank_var in os.environ and size_var in os.environ:
            theirs = (_env_int(rank_var), _env_int(size_var))
            if theirs != (rank, size):
                raise ValueError(
                    f"RANK={rank}, WORLD_SIZE={size} disagree with the launcher that started "
                    f"this process ({rank_var}={theirs[0]}, {size_var}={theirs[1]}): unset "
                    "RANK and WORLD_SIZE under mpirun/mpiexec, or make them agree"
                )


def launched_by_mpirun() -> bool:
    """True under mpirun/mpiexec (Open MPI, MPICH, Intel MPI) or srun with PMI."""
    return any(v in os.environ for v in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"))


# (local size, world size) variables of launchers that say how many ranks share a host.
_LOCAL_SIZES = (
    ("LOCAL_WORLD_SIZE", "WORLD_SIZE"),  # ringreduce launch, torchrun
    ("OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_SIZE"),  # Open MPI
    ("MPI_LOCALNRANKS", "PMI_SIZE"),  # MPICH (Hydra)
)


def _spans_hosts() -> Optional[str]:
    """The variables that show this job's ranks are on several hosts, or None."""
    for local_var, size_var in _LOCAL_SIZES:
        local, size = os.environ.get(local_var, ""), os.environ.get(size_var, "")
        if local.isdigit() and size.isdigit() and int(local) < int(size):
            return f"{local_var}={local} < {size_var}={size}"
    return None


# (local rank, local size) variables, in the order they are trusted.
_LOCAL_RANKS = (
    ("LOCAL_RANK", "LOCAL_WORLD_SIZE"),  # ringreduce launch, torchrun
    ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),  # Open MPI
    ("MPI_LOCALRANKID", "MPI_LOCALNRANKS"),  # MPICH (Hydra)
    ("SLURM_LOCALID", ""),  # srun
)


def local_rank_and_size(rank: int, size: int) -> Tuple[str, Optional[str]]:
    """(LOCAL_RANK, LOCAL_WORLD_SIZE or None) as this process's launcher says: a world of
    one is its own host; without a launcher that says, a rank per host is assumed (as
    torch.distributed assumes nothing)."""
    for rank_var, size_var in _LOCAL_RANKS:
        if os.environ.get(rank_var, "").isdigit():
            local_size = os.environ.get(size_var, "") if size_var else ""
            return os.environ[rank_var], local_size if local_size.isdigit() else None
    if size == 1:
        return "0", "1"
    return str(rank), None


def torch_env_init_ready() -> bool:
    """True when RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT are all set: what
    torch.distributed's ``env://`` reads (ringreduce launch, torchrun)."""
    return all(os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def master_port(default: int) -> int:
    """MASTER_PORT as a port number (ValueError naming it otherwise), or ``default``."""
    return _port_env("MASTER_PORT") if os.environ.get("MASTER_PORT") else default


def export_launch(rank: int, size: int, local_rank: str, local_size: Optional[str]) -> None:
    """Sets RANK, WORLD_SIZE, LOCAL_RANK (and LOCAL_WORLD_SIZE where known) where they are
    not set, as torchrun would have: trainers read them to see a multi-process run."""
    os.environ.setdefault("RANK", str(rank))
    os.environ.setdefault("WORLD_SIZE", str(size))
    os.environ.setdefault("LOCAL_RANK", local_rank)
    if local_size is not None:
        os.environ.setdefault("LOCAL_WORLD_SIZE", local_size)


def _port_env(name: str) -> int:
    text = os.environ[name]
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{name} must be a port number, got {text!r}") from None


def master_address(
    addr: Optional[str], port: Optional[int], any_port: bool = False
) -> Tuple[str, int]:
    """Where rank 0 hosts ringreduce's rendezvous store: MASTER_ADDR (default loopback),
    and ``port``, else RINGREDUCE_PORT, else MASTER_PORT (default 29500). ``any_port``:
    port 0 is allowed (rank 0, whose store then listens on a port the kernel picks).

    Under torchrun MASTER_PORT + 1: torchrun's agent store already listens on MASTER_PORT
    (and torch.distributed's env:// init uses that store). ``ringreduce launch`` sets
    RINGREDUCE_PORT to MASTER_PORT + 1 for the same reason: a script may call both
    ``dist.init_process_group`` (env://) and ``rr.init()``.

    Loopback serves ranks of one host only: without MASTER_ADDR, a job whose launcher
    says it spans hosts is a ValueError (each host's ranks would look for rank 0 on
    their own host, and time out).
    """
    if addr is None and "MASTER_ADDR" not in os.environ:
        spread = _spans_hosts()
        if spread is not None:
            given = (
                f"MASTER_PORT={os.environ['MASTER_PORT']} is set but "
                if ("MASTER_PORT" in os.environ)
                else ""
            )
            raise ValueError(
                f"{given}MASTER_ADDR is not set, and the ranks are on several hosts "
                f"({spread}): set MASTER_ADDR to rank 0's host (or pass master_addr=)"
            )
    host = addr if addr is not None else os.environ.get("MASTER_ADDR", "127.0.0.1")
    if port is None:
        if os.environ.get("RINGREDUCE_PORT"):
            port = _port_env("RINGREDUCE_PORT")
        else:
            port = _port_env("MASTER_PORT") if "MASTER_PORT" in os.environ else 29500
            if os.environ.get("TORCHELASTIC_RUN_ID"):  # set by torchrun for its workers
                port += 1
    if not (0 < int(port) < 65536 or (any_port and int(port) == 0)):
        raise ValueError(f"master_port must be in 1..65535, got {port}")
    return host, int(port)


def segment_bytes() -> int:
    """RINGREDUCE_SEGMENT_BYTES (the size of every message of a collective), or the
    engine's default (128 KiB).

    Every rank of a job must use the same value: the call header compares them.
    """
    text = os.environ.get("RINGREDUCE_SEGMENT_BYTES", "")
    if not text:
        return _core.Options().segment_bytes
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 1 << 30:
        raise ValueError(
            f"RINGREDUCE_SEGMENT_BYTES must be a whole number of bytes in 1..{1 << 30}, "
            f"got {text!r}"
        )
    return value


def _int_env(name: str, default: int, low: int = 0) -> int:
    text = os.environ.get(name, "")
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if value < low:
        raise ValueError(f"{name} must be a whole number >= {low}, got {text!r}")
    return value


def small_bytes() -> int:
    """RINGREDUCE_SMALL_BYTES (all_reduce up to this size at 2 ranks, scaled by 2/N,
    takes a latency path), or the engine's default."""
    return _int_env("RINGREDUCE_SMALL_BYTES", _core.Options().small_bytes)


def transport_setting() -> Optional[str]:
    """RINGREDUCE_TRANSPORT (which links ``transport="auto"`` means), or None."""
    return os.environ.get("RINGREDUCE_TRANSPORT") or None


def token() -> str:
    """RINGREDUCE_TOKEN, the job's secret, or "" (none)."""
    return os.environ.get("RINGREDUCE_TOKEN", "")


def master_addr() -> Optional[str]:
    """MASTER_ADDR as set (possibly empty), or None where it is not set."""
    return os.environ.get("MASTER_ADDR")


def launched_with_rank() -> bool:
    """True when RANK and WORLD_SIZE are both set (ringreduce launch, torchrun)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def launcher_rank() -> Optional[str]:
    """This process's rank as the first launcher that sets one says, unchecked (for
    messages), or None."""
    for rank_var, _ in _LAUNCHERS:
        if os.environ.get(rank_var):
            return os.environ[rank_var]
    return None


DEBUG_TOPICS = ("algorithm", "faults")


def debug_topics() -> set:
    """RINGREDUCE_DEBUG: a comma-separated list of what the engine logs to stderr.
    ``algorithm``: for every collective, which algorithm runs and why (and once, on shared
    memory, whether waits spin or yield); ``faults``: where
    a SIGBUS or SIGSEGV struck (installed by engine_options, when a communicator is made)."""
    text = os.environ.get("RINGREDUCE_DEBUG", "")
    topics = {t.strip() for t in text.split(",") if t.strip()}
    unknown = sorted(topics - set(DEBUG_TOPICS) - {"all"})
    if unknown:
        raise ValueError(
            f"RINGREDUCE_DEBUG: unknown topic(s) {unknown} in {text!r}; known: "
            f"{', '.join(DEBUG_TOPICS)} (or all)"
        )
    return set(DEBUG_TOPICS) if "all" in topics else topics


def engine_options(transport: str, timeout: float) -> Any:
    """The engine's settings for a new communicator: ``transport`` and ``timeout`` as
    given, the rest from the RINGREDUCE_* environment, read here once; what is not set
    keeps the default of a default-made Options (csrc/engine/options.h)."""
    options = _core.Options()
    options.transport = transport
    options.timeout_seconds = float(timeout)
    options.segment_bytes = segment_bytes()
    options.small_bytes = small_bytes()
    options.algorithm = os.environ.get("RINGREDUCE_ALGORITHM", options.algorithm)
    topics = debug_topics()
    options.log_algorithm = "algorithm" in topics
    if "faults" in topics:
        _core.install_fault_report()  # once per process; later calls change nothing
    options.tcp_streams = _int_env("RINGREDUCE_TCP_STREAMS", options.tcp_streams)
    if options.tcp_streams > 16:
        raise ValueError(
            f"RINGREDUCE_TCP_STREAMS must be 1..16 (0 or unset: from the NIC's speed), "
            f"got {options.tcp_streams}"
        )
    options.tcp_keepalive_seconds = _int_env(
        "RINGREDUCE_TCP_KEEPALIVE", options.tcp_keepalive_seconds
    )
    options.spin_us = _int_env("RINGREDUCE_SPIN_US", options.spin_us)
    options.shm_single_copy_bytes = _int_env(
        "RINGREDUCE_SHM_SINGLE_COPY_BYTES", options.shm_single_copy_bytes
    )
    options.shm_slot_bytes = _int_env("RINGREDUCE_SHM_SLOT_BYTES", options.shm_slot_bytes)
    options.device_staging_bytes = _int_env(
        "RINGREDUCE_DEVICE_STAGING_BYTES", options.device_staging_bytes
    )
    in_place = _int_env("RINGREDUCE_DEVICE_IN_PLACE", int(options.device_land_in_place))
    if in_place > 1:
        raise ValueError(f"RINGREDUCE_DEVICE_IN_PLACE must be 0 or 1, got {in_place}")
    options.device_land_in_place = bool(in_place)
    options.stream_store_bytes = _int_env(
        "RINGREDUCE_STREAM_STORE_BYTES", options.stream_store_bytes
    )
    options.host_id = os.environ.get("RINGREDUCE_HOST_ID", options.host_id)
    options.socket_addr = os.environ.get("RINGREDUCE_SOCKET_ADDR", options.socket_addr)
    # Tests only: the engine's CPU stand-in for CUDA devices.
    options.fake_device = os.environ.get("RINGREDUCE_TEST_FAKE_DEVICE") == "1"
    return options
