"""Where rank and world size come from, for each launcher we know."""

from __future__ import annotations

import os
from typing import Any, Optional, Tuple

# (rank variable, size variable), in the order they are trusted.
_LAUNCHERS = (
    ("RANK", "WORLD_SIZE"),  # ringreduce launch, torchrun
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),  # Open MPI
    ("PMI_RANK", "PMI_SIZE"),  # MPICH, Intel MPI
    ("PMIX_RANK", "PMIX_SIZE"),
    ("SLURM_PROCID", "SLURM_NTASKS"),  # srun
)


def rank_and_size(rank: Optional[int], world_size: Optional[int]) -> Tuple[int, int]:
    """Fills in rank/world size from the environment where the caller gave none."""
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
            r = int(os.environ[rank_var]) if rank is None else int(rank)
            s = int(os.environ[size_var]) if world_size is None else int(world_size)
            return r, s
    if rank is None and world_size is None:
        return 0, 1  # a plain `python script.py`: a world of one
    raise ValueError(
        "rank and world_size must both be given, or both come from the environment "
        "(RANK/WORLD_SIZE, OMPI_COMM_WORLD_RANK/_SIZE, PMI_RANK/PMI_SIZE, "
        "SLURM_PROCID/SLURM_NTASKS)"
    )


def launched_by_mpirun() -> bool:
    """True under mpirun/mpiexec (Open MPI, MPICH, Intel MPI) or srun with PMI."""
    return any(v in os.environ for v in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"))


def master_address(addr: Optional[str], port: Optional[int]) -> Tuple[str, int]:
    """Where rank 0 hosts ringreduce's rendezvous store: MASTER_ADDR (default loopback),
    and ``port``, else RINGREDUCE_PORT, else MASTER_PORT (default 29500).

    Under torchrun MASTER_PORT + 1: torchrun's agent store already listens on MASTER_PORT
    (and torch.distributed's env:// init uses that store). ``ringreduce launch`` sets
    RINGREDUCE_PORT to MASTER_PORT + 1 for the same reason: a script may call both
    ``dist.init_process_group`` (env://) and ``rr.init()``.
    """
    host = addr if addr is not None else os.environ.get("MASTER_ADDR", "127.0.0.1")
    if port is None:
        if os.environ.get("RINGREDUCE_PORT"):
            port = int(os.environ["RINGREDUCE_PORT"])
        else:
            port = int(os.environ.get("MASTER_PORT", "29500"))
            if os.environ.get("TORCHELASTIC_RUN_ID"):  # set by torchrun for its workers
                port += 1
    if not 0 < int(port) < 65536:
        raise ValueError(f"master_port must be in 1..65535, got {port}")
    return host, int(port)


# Default pipelining unit: large enough to amortize per-message overhead, small
# enough that reducing one segment overlaps the arrival of the next and that the
# segments in flight stay in the cache (shared-memory slots, TCP receive buffers).
# Measured side by side with MPI_Allreduce and Gloo (README, Performance), 128 KiB
# beat 1 MiB on shared memory at every size from 1 MB and matched it over TCP.
DEFAULT_SEGMENT_BYTES = 128 << 10


def segment_bytes() -> int:
    """RINGREDUCE_SEGMENT_BYTES (the size of every message of a collective), or 128 KiB.

    Every rank of a job must use the same value: the call header compares them.
    """
    text = os.environ.get("RINGREDUCE_SEGMENT_BYTES", "")
    if not text:
        return DEFAULT_SEGMENT_BYTES
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


def engine_options(transport: str, timeout: float) -> Any:
    """The engine's settings for a new communicator: ``transport`` and ``timeout`` as
    given, the rest from the RINGREDUCE_* environment, read here once."""
    from . import _core

    options = _core.Options()
    options.transport = transport
    options.timeout_seconds = float(timeout)
    options.segment_bytes = segment_bytes()
    options.small_bytes = _int_env("RINGREDUCE_SMALL_BYTES", 64 << 10)
    options.spin_us = _int_env("RINGREDUCE_SPIN_US", 50)
    options.shm_single_copy_bytes = _int_env("RINGREDUCE_SHM_SINGLE_COPY_BYTES", 0)
    options.shm_slot_bytes = _int_env("RINGREDUCE_SHM_SLOT_BYTES", 0)
    options.host_id = os.environ.get("RINGREDUCE_HOST_ID", "")
    options.socket_addr = os.environ.get("RINGREDUCE_SOCKET_ADDR", "")
    # Tests only: the engine's CPU stand-in for CUDA devices.
    options.fake_device = os.environ.get("RINGREDUCE_TEST_FAKE_DEVICE") == "1"
    return options
