"""GradientBucketer(fault_tolerant=True): a rank dies in the middle of a step's
all-reduces (after the first bucket was reduced with it); the survivors' step still
finishes, with the average over the survivors alone, equal to a clean computation that
drops the dead rank's micro-batch for that step (1e-12 in float64), and the next steps
average over the survivors."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from _ranks import free_port, run_scripts

SCRIPT = os.path.join(os.path.dirname(__file__), "_ft_bucket_rank.py")
sys.path.insert(0, os.path.dirname(__file__))
from _ft_bucket_rank import SHAPES  # noqa: E402


def expected(ranks: list, step: int) -> list:
    return [
        np.mean([np.full(s, 1.0 + r + 10 * step + i) for r in ranks], axis=0)
        for i, s in enumerate(SHAPES)
    ]


@pytest.mark.parametrize(
    "transport, dtype, tol",
    [("tcp", "float64", 1e-12), ("shm", "float64", 1e-12), ("tcp", "float16", 2e-3)],
)
def test_a_step_that_loses_a_rank_finishes_with_the_survivors_average(transport, dtype, tol):
    n, victim, steps = 4, 2, 3
    port = free_port()
    reports = run_scripts(
        SCRIPT, lambda r: [r, n, port, transport, victim, steps, dtype], n, victim
    )
    survivors = [r for r in range(n) if r != victim]
    assert sorted(reports) == survivors
    for report in reports.values():
        assert len(report["plan"]) == 4, report["plan"]  # one bucket per parameter
        assert report["changes"] == [3], report
        for step, got in enumerate(report["steps"]):
            ranks = list(range(n)) if step == 0 else survivors
            assert got["world"] == len(ranks)
            for g, want in zip(got["grads"], expected(ranks, step)):
                np.testing.assert_allclose(np.asarray(g).reshape(want.shape), want, rtol=tol)
    # Replicas identical, bit for bit.
    first = reports[survivors[0]]["steps"]
    assert all(reports[r]["steps"] == first for r in survivors)


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_survivors_a_death_left_a_step_behind_take_its_results_from_the_others(transport):
    # A death can end a step on some survivors and not on others (a collective completes
    # where all it needed arrived first). Those that ended it fail in the next step; the
    # survivors must not reduce one step's gradients with another's (the shapes agree,
    # so nothing else would notice): the one behind takes step 1's results, reduced with
    # every rank, and step 2 is the survivors' average on every survivor.
    n, victim, laggard, steps = 4, 3, 1, 4
    port = free_port()
    reports = run_scripts(
        SCRIPT, lambda r: [r, n, port, transport, victim, steps, "float64", laggard], n, victim
    )
    survivors = [r for r in range(n) if r != victim]
    assert sorted(reports) == survivors
    for report in reports.values():
        assert report["changes"] == [3], report["changes"]
        for step, got in enumerate(report["steps"]):
            ranks = list(range(n)) if step < 2 else survivors
            for g, want in zip(got["grads"], expected(ranks, step)):
                np.testing.assert_allclose(np.asarray(g).reshape(want.shape), want, rtol=1e-12)
    first = reports[survivors[0]]["steps"]
    assert all(
        [s["grads"] for s in reports[r]["steps"]] == [s["grads"] for s in first] for r in survivors
    )


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_gradsync_step_that_loses_a_rank_equals_the_survivors_run(transport):
    """Over shared memory the buckets are in windows: the survivors allocate them again
    on the shrunk communicator, and GradSync's gradients follow."""
    torch = pytest.importorskip("torch", reason="needs torch: pip install torch")
    from _ft_gradsync_rank import LR, batch, model_and_data

    n, victim, steps = 3, 1, 3
    port = free_port()
    script = os.path.join(os.path.dirname(__file__), "_ft_gradsync_rank.py")
    reports = run_scripts(script, lambda r: [r, n, port, transport, victim, steps], n, victim)
    # The same training in one process: from step 1 on, the victim's micro-batch is gone.
    net = model_and_data()
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    for step in range(steps):
        ranks = [r for r in range(n) if step == 0 or r != victim]
        total = [torch.zeros_like(p) for p in net.parameters()]
        for r in ranks:
            net.zero_grad()
            x, y = batch(r, step)
            torch.nn.functional.mse_loss(net(x), y).backward()
            total = [t + p.grad for t, p in zip(total, net.parameters())]
        for p, t in zip(net.parameters(), total):
            p.grad = t / len(ranks)
        opt.step()
    want = [p.detach().reshape(-1).numpy() for p in net.parameters()]
    assert sorted(reports) == [r for r in range(n) if r != victim]
    for report in reports.values():
        assert report["changes"] == [n - 1], report["changes"]
        for got, w in zip(report["weights"], want):
            np.testing.assert_allclose(got, w, rtol=1e-12, atol=1e-15)
