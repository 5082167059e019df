"""examples/elastic_training.py: a rank killed in the middle of a step's all_reduce; the
survivors shrink, finish that step without its micro-batch and train on, with weights
bitwise identical on every survivor and equal to a one-process run of the same steps."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "elastic_training.py")


def _example():
    spec = importlib.util.spec_from_file_location("elastic_training", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def reference(
    n: int, steps: int, lr: float, kill_rank: int, kill_step: int, grow_step: int = -1
) -> list:
    """The same training in one process: from kill_step on, shard kill_rank is gone, and
    from grow_step on (if given) back."""
    ex = _example()
    w = ex.init_weights()
    for step in range(steps):
        gone = kill_step <= step and not 0 <= grow_step <= step
        shards = [s for s in range(n) if not (s == kill_rank and gone)]
        grads = [ex.loss_and_grads(w, *ex.micro_batch(s, step))[1] for s in shards]
        mean = sum(ex.flat(g) for g in grads) / len(shards)
        w = [wi - lr * gi for wi, gi in zip(w, ex.unflat(mean, grads[0]))]
    return w


@pytest.mark.parametrize("kill_rank", [2, 0, -1], ids=["rank2", "rank0", "none"])
def test_training_survives_a_killed_rank(tmp_path, kill_rank):
    n, steps, kill_step = 4, 12, 5
    cmd = [
        sys.executable,
        "-m",
        "ringreduce",
        "launch",
        "-n",
        str(n),
        "--keep-going",
        "--",
        sys.executable,
        EXAMPLE,
        "--steps",
        str(steps),
        "--kill-rank",
        str(kill_rank),
        "--kill-step",
        str(kill_step),
        "--save",
        str(tmp_path),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    digests = dict(re.findall(r"shard (\d+): weights (\w+)", proc.stdout))
    survivors = [s for s in range(n) if s != kill_rank]
    assert sorted(map(int, digests)) == survivors, proc.stdout[-3000:]
    assert len(set(digests.values())) == 1, digests  # bitwise identical replicas
    want = reference(n, steps, 0.1, kill_rank, kill_step)
    for shard in survivors:
        saved = np.load(tmp_path / f"shard{shard}.npz")
        for i, r in enumerate(want):
            np.testing.assert_allclose(saved[f"arr_{i}"], r, rtol=1e-12, atol=1e-14)
    if kill_rank >= 0:
        assert f"rank(s) [{kill_rank}] died; {n - 1} go on" in proc.stdout, proc.stdout[-2000:]


def test_a_newcomer_takes_the_lost_shard_and_the_run_ends_on_every_rank(tmp_path):
    n, steps, kill_rank, kill_step, grow_step = 4, 12, 1, 4, 8
    cmd = [
        sys.executable,
        "-m",
        "ringreduce",
        "launch",
        "-n",
        str(n),
        "--keep-going",
        "--",
        sys.executable,
        EXAMPLE,
        "--steps",
        str(steps),
        "--kill-rank",
        str(kill_rank),
        "--kill-step",
        str(kill_step),
        "--grow-step",
        str(grow_step),
        "--save",
        str(tmp_path),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"shard(s) [{kill_rank}] back on newcomers" in proc.stdout, proc.stdout[-2000:]
    digests = dict(re.findall(r"shard (\d+): weights (\w+)", proc.stdout))
    assert sorted(map(int, digests)) == list(range(n)), proc.stdout[-3000:]
    assert len(set(digests.values())) == 1, digests  # the newcomer's replica too
    want = reference(n, steps, 0.1, kill_rank, kill_step, grow_step)
    saved = np.load(tmp_path / f"shard{kill_rank}.npz")  # written by the newcomer
    for i, r in enumerate(want):
        np.testing.assert_allclose(saved[f"arr_{i}"], r, rtol=1e-12, atol=1e-14)
