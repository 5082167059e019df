"""What a new user meets first: the command line, the API's small conveniences, torch and
ringreduce in one job, error messages that say what to check, and the examples."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import traceback

import numpy as np
import pytest

import ringreduce as rr
from ringreduce import _core
from ringreduce.launch import free_port

from _ranks import run_ranks

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CLI = [sys.executable, "-m", "ringreduce"]


def _run(args: list, timeout: float = 120, env: dict = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        args, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, env=env
    )


# ---- command line ------------------------------------------------------------


def test_version_and_info():
    r = _run([*CLI, "--version"])
    assert r.returncode == 0 and r.stdout.strip() == f"ringreduce {rr.__version__}"
    info = json.loads(_run([*CLI, "info"]).stdout)
    assert info["version"] == rr.__version__
    assert {"tcp", "shm"} <= set(info["transports"])
    assert isinstance(info["cuda"], bool) and isinstance(info["cuda_devices"], int)
    assert info["cpu_kernels"] in ("avx2", "generic")
    assert info["codec_kernels"] == _core.codec_kernel_isas()[0]


def test_bench_help_shows_suffixes_and_defaults():
    text = _run([*CLI, "bench", "-h"]).stdout
    assert "suffixes K, M and G" in text
    for default in (
        "default: 8)",
        "default: 64M)",
        "default: 2)",
        "default: float32)",
        "default: sum",
        "default: 3)",
        "default: 60)",
    ):
        assert default in text, default


def test_dir_shows_the_api_only():
    names = dir(rr)
    assert "init" in names and "Communicator" in names and "torch" in names
    assert not [n for n in names if n.startswith("_") and n != "__version__"]
    assert "annotations" not in names and "Any" not in names


# ---- API conveniences --------------------------------------------------------


def _conveniences(comm):
    import torch.distributed as dist

    n, r = comm.world_size, comm.rank
    failures = []
    zero_d = comm.all_reduce(np.array(float(r + 1)))
    if zero_d.shape != () or zero_d != n * (n + 1) / 2:
        failures.append(f"0-d all_reduce gave {zero_d!r}")
    got = comm.all_reduce(np.array([r, -r], dtype=np.int64), op=dist.ReduceOp.MAX)
    if got.tolist() != [n - 1, 0]:
        failures.append(f"torch ReduceOp.MAX gave {got}")
    if comm.all_gather_object({"rank": r, "tag": "x" * r}) != [
        {"rank": i, "tag": "x" * i} for i in range(n)
    ]:
        failures.append("all_gather_object")
    if comm.broadcast_object(("from", r), root=n - 1) != ("from", n - 1):
        failures.append("broadcast_object")
    uneven = comm.all_gather(np.full((r + 1, 2), r, dtype=np.int32), uneven=True)
    want = np.concatenate([np.full((i + 1, 2), i, dtype=np.int32) for i in range(n)])
    if not np.array_equal(uneven, want):
        failures.append(f"uneven all_gather gave {uneven.tolist()}")
    work = comm.all_reduce(np.ones(4), async_op=True)
    work.wait()
    if not work.is_completed():
        failures.append("is_completed() False after wait()")
    if (comm.local_rank, comm.local_world_size) != (r, n):
        failures.append(f"local rank {comm.local_rank} of {comm.local_world_size}")
    return failures


@pytest.mark.torch
@pytest.mark.parametrize("n", [2, 3])
def test_api_conveniences(group_factory, n):
    pytest.importorskip(
        "torch", reason="needs torch: pip install torch (the CPU wheel is enough; docs/install.md)"
    )
    assert group_factory(n).run(_conveniences) == [[]] * n


def _optimizer_state(comm):
    import torch

    torch.manual_seed(comm.rank)  # different models and histories on every rank
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.01 * (comm.rank + 1))
    for _ in range(comm.rank + 1):
        model(torch.randn(4, 3)).sum().backward()
        opt.step()
    rr.torch.broadcast_parameters(model, comm, root=0)
    rr.torch.broadcast_optimizer_state(opt, comm, root=0)
    state = opt.state_dict()
    flat = [state["param_groups"][0]["lr"]]
    for s in state["state"].values():
        flat += [float(s["step"])] + s["exp_avg"].reshape(-1).tolist()
    return flat


@pytest.mark.torch
def test_broadcast_optimizer_state(group_factory):
    pytest.importorskip(
        "torch", reason="needs torch: pip install torch (the CPU wheel is enough; docs/install.md)"
    )
    results = group_factory(3).run(_optimizer_state)
    assert results[0][0] == pytest.approx(0.01) and results[0][1] == 1.0
    assert results[1] == results[0] and results[2] == results[0]


# ---- torch.distributed and ringreduce in one job -------------------------------


TORCH_AND_RR = (
    "import torch, torch.distributed as dist, numpy as np, ringreduce as rr\n"
    "dist.init_process_group('gloo')\n"
    "comm = rr.init(timeout=60)\n"
    "t = torch.ones(3) * (dist.get_rank() + 1)\n"
    "dist.all_reduce(t)\n"
    "x = comm.all_reduce(np.ones(3) * (comm.rank + 1))\n"
    "print('ok', dist.get_rank(), t.tolist() == x.tolist())\n"
    "comm.close(); dist.destroy_process_group()\n"
)


@pytest.mark.torch
def test_torch_and_ringreduce_in_one_job_under_our_launcher():
    pytest.importorskip(
        "torch", reason="needs torch: pip install torch (the CPU wheel is enough; docs/install.md)"
    )
    r = _run([*CLI, "launch", "-n", "2", "--", sys.executable, "-c", TORCH_AND_RR])
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.split("\n")[:2]) == ["[0] ok 0 True", "[1] ok 1 True"]


@pytest.mark.torch
def test_torch_and_ringreduce_in_one_job_under_torchrun(tmp_path):
    pytest.importorskip(
        "torch", reason="needs torch: pip install torch (the CPU wheel is enough; docs/install.md)"
    )
    script = tmp_path / "train.py"
    script.write_text(TORCH_AND_RR)
    env = dict(os.environ)
    env.pop("RINGREDUCE_TRANSPORT", None)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-port",
        str(free_port()),
        str(script),
    ]
    r = _run(cmd, timeout=180, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    # torchrun does not prefix or line-buffer the ranks' output: count the words
    assert r.stdout.count("True") == 2 and "False" not in r.stdout, r.stdout


# ---- messages ----------------------------------------------------------------


def test_a_rank_that_never_joins_is_named_with_where_to_look():
    port = free_port()
    with pytest.raises(rr.TimeoutError) as caught:
        rr.init("tcp", rank=0, world_size=2, master_addr="127.0.0.1", master_port=port, timeout=1.5)
    message = str(caught.value)
    assert message.startswith("rank 1 did not join within 1.5 s")
    assert f"127.0.0.1:{port}" in message and "world size 2" in message
    assert caught.value.peer == 1


def test_a_taken_rendezvous_port_says_what_to_set():
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(rr.RingReduceError) as caught:
            rr.init(
                "tcp", rank=0, world_size=2, master_addr="127.0.0.1", master_port=port, timeout=5
            )
    message = str(caught.value)
    assert f"port {port}" in message and "set RINGREDUCE_PORT" in message, message


def _mismatch(comm):
    comm.all_reduce(np.ones(10 + (comm.rank == comm.world_size - 1)))


def test_relayed_errors_lead_with_their_own_call_then_the_culprit_and_the_cause():
    outcomes = run_ranks(3, _mismatch, init_timeout=60)
    assert all(kind == "err" for kind, *_ in outcomes), outcomes
    messages = [str(error) for _, error, _ in outcomes]
    for rank, m in enumerate(messages):
        # Each rank says its own call first (rank 2 passed 11 values, the others 10)...
        call = f"all_reduce(count={10 + (rank == 2)}, float64, sum) (call #1)"
        assert m.startswith(f"rank {rank}: {call} failed: "), m
        assert "collective mismatch between rank" in m.split("[", 1)[0], m
        # Stated once: a rank that saw the mismatch too does not repeat it in brackets;
        # a rank that saw something else (its link going down) says so after it.
        assert m.count("mismatch between") == 1, m
    # ...then the same first failure as every other rank.
    causes = {m.split(" failed: ", 1)[1].split(" [", 1)[0] for m in messages}
    assert len(causes) == 1, messages


def _ours(tb) -> list:
    """The frames of a traceback that are in ringreduce's own files."""
    package = os.path.dirname(os.path.abspath(rr.__file__))
    return [f for f in traceback.extract_tb(tb) if os.path.abspath(f.filename).startswith(package)]


class _RefusesDLPack:
    def __dlpack__(self, **_: object) -> object:
        raise BufferError("this exporter refuses")

    def __dlpack_device__(self) -> tuple:
        return (1, 0)


def test_argument_errors_show_one_frame_of_ours_and_keep_their_cause():
    with rr.init("tcp", rank=0, world_size=1, master_port=free_port()) as comm:
        calls = [
            lambda: comm.all_reduce(np.ones(3), op="xor"),
            lambda: comm.reduce_scatter(np.ones(3), out=np.ones(7)),
            lambda: comm.broadcast(np.ones(3), root=5),
            lambda: comm.all_reduce(_RefusesDLPack()),
        ]
        for call in calls:
            with pytest.raises((ValueError, TypeError)) as caught:
                call()
            frames = _ours(caught.value.__traceback__)
            assert len(frames) == 1, traceback.format_tb(caught.value.__traceback__)
        # The last one was caused by the exporter: the cause is still attached.
        assert isinstance(caught.value.__cause__, BufferError)


def test_engine_errors_show_one_frame_of_ours():
    # The ranks are processes: each sends back its traceback as text.
    package = os.path.dirname(os.path.abspath(rr.__file__))
    outcomes = run_ranks(2, _mismatch, init_timeout=60)
    for kind, error, text in outcomes:
        assert kind == "err" and isinstance(error, rr.MismatchError), outcomes
        frames = [line for line in text.splitlines() if line.strip().startswith("File ")]
        assert sum(package in line for line in frames) == 1, text
        assert "collective mismatch" in text.splitlines()[-1], text


_TORCH_MISMATCH = (
    "import datetime, torch, torch.distributed as dist, ringreduce.torch\n"
    "dist.init_process_group('ringreduce', timeout=datetime.timedelta(seconds=30))\n"
    "dist.all_reduce(torch.ones(4 + dist.get_rank()))\n"
)


def test_torch_backend_numbers_the_programs_first_collective_call_1():
    # Making the group meets through the store, not through a collective of its own.
    pytest.importorskip(
        "torch", reason="needs torch: pip install torch (the CPU wheel is enough; docs/install.md)"
    )
    r = _run([*CLI, "launch", "-n", "2", "--", sys.executable, "-c", _TORCH_MISMATCH])
    assert r.returncode != 0
    assert "MismatchError" in r.stderr and "(call #1)" in r.stderr, r.stderr[-3000:]
    assert "call #2" not in r.stderr, r.stderr[-3000:]


def test_launched_by_mpirun_without_mpi_support_says_what_runs():
    code = (
        "import sys; sys.modules['ringreduce._core_mpi'] = None\n"
        "import ringreduce as rr\n"
        "rr.init(timeout=10).close()\n"
    )
    env = dict(os.environ, OMPI_COMM_WORLD_RANK="0", OMPI_COMM_WORLD_SIZE="1")
    env.pop("RINGREDUCE_TRANSPORT", None)
    r = _run([sys.executable, "-c", code], env=env)
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stderr.splitlines() if "launched by mpirun" in line]
    assert len(lines) == 1 and "MPI support is not available" in lines[0], r.stderr


# ---- examples ----------------------------------------------------------------


@pytest.mark.parametrize(
    "script, args",
    [
        ("numpy_mlp.py", ["--steps", "5"]),
        ("numpy_zero.py", ["--steps", "5"]),
        ("torch_gradsync.py", ["--steps", "40"]),
        ("torch_ddp.py", ["--epochs", "3"]),
    ],
)
def test_examples_run_as_documented(script, args):
    if script.startswith("torch"):
        pytest.importorskip(
            "torch",
            reason="needs torch: pip install torch (the CPU wheel is enough; docs/install.md)",
        )
    path = os.path.join(ROOT, "examples", script)
    r = _run([*CLI, "launch", "-n", "2", "--", sys.executable, path, *args], timeout=300)
    assert r.returncode == 0, r.stderr
    assert "replicas identical: True" in r.stdout, r.stdout
    if script == "numpy_zero.py":
        diff = float(r.stdout.split("max |ZeRO - plain data parallel| = ")[1].split()[0])
        assert diff <= 1e-12, r.stdout
