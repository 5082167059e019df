"""GradientBucketer: equivalence with one large batch, plan checks, no_sync, unused
parameters, comm dtypes, gradient trees and the trace.

Rank-side functions are module level so the spawned rank processes can unpickle them.
Expected values come from rank and world size alone; sums of small integers compare
exactly, random float64 training compares with a reference to 1e-12.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from collections import OrderedDict, namedtuple

import numpy as np
import pytest

import ringreduce as rr
from ringreduce._bucket_plan import first_difference, plan_buckets
from ringreduce.bucketing import GradientBucketer

MLP_SIZES = (6, 16, 12, 3)
LR = 0.1

# ----------------------------------------------------------------------------- the model


def mlp_init(sizes: tuple[int, ...], seed: int) -> list[np.ndarray]:
    """[W0, b0, W1, b1, ...] in model order; biases nonzero so their gradients matter."""
    rng = np.random.default_rng(seed)
    params = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        params.append(rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in))
        params.append(0.1 * rng.standard_normal(fan_out))
    return params


def mlp_batch(step: int, rows: int, sizes: tuple[int, ...], seed: int):
    """The global batch of one step; rank r trains on rows [r*b, (r+1)*b)."""
    rng = np.random.default_rng([seed, step])
    return rng.standard_normal((rows, sizes[0])), rng.standard_normal((rows, sizes[-1]))


def mlp_backward(params: list[np.ndarray], x: np.ndarray, y: np.ndarray, on_grad=None):
    """Loss 0.5 * mean over rows of |out - y|^2 with tanh hidden layers. Returns the
    gradients in model order; calls on_grad(index, grad) last layer first, as each one
    is computed."""
    acts = [x]
    n_layers = len(params) // 2
    for layer in range(n_layers):
        z = acts[-1] @ params[2 * layer] + params[2 * layer + 1]
        acts.append(np.tanh(z) if layer < n_layers - 1 else z)
    delta = (acts[-1] - y) / x.shape[0]
    grads: list = [None] * len(params)
    for layer in reversed(range(n_layers)):
        grads[2 * layer + 1] = delta.sum(axis=0)
        grads[2 * layer] = acts[layer].T @ delta
        if on_grad is not None:
            on_grad(2 * layer + 1, grads[2 * layer + 1])
            on_grad(2 * layer, grads[2 * layer])
        if layer:
            delta = (delta @ params[2 * layer].T) * (1.0 - acts[layer] ** 2)
    return grads


def train_reference(world_size: int, b: int, steps: int, seed: int) -> list[np.ndarray]:
    """One process, batch world_size * b: what data-parallel training must reproduce."""
    params = mlp_init(MLP_SIZES, seed)
    for step in range(steps):
        x, y = mlp_batch(step, world_size * b, MLP_SIZES, seed)
        for p, g in zip(params, mlp_backward(params, x, y)):
            p -= LR * g
    return params


def train_data_parallel(
    comm, b: int, steps: int, seed: int, bucket_mb: float, first_bucket_mb: float
):
    """Rank side: SGD on this rank's rows, gradients averaged by a GradientBucketer."""
    bucketer = GradientBucketer(comm, bucket_mb=bucket_mb, first_bucket_mb=first_bucket_mb)
    params = mlp_init(MLP_SIZES, seed)
    handles = [bucketer.register(f"p{i}", p.shape, p.dtype) for i, p in enumerate(params)]
    rows = slice(comm.rank * b, (comm.rank + 1) * b)
    for step in range(steps):
        x, y = mlp_batch(step, comm.world_size * b, MLP_SIZES, seed)
        grads = mlp_backward(
            params, x[rows], y[rows], on_grad=lambda i, g: bucketer.ready(handles[i], g)
        )
        bucketer.wait()
        for p, g in zip(params, grads):
            p -= LR * g
    return params, bucketer.plan


def assert_replicas_identical(results: list) -> None:
    for rank_params in results[1:]:
        for mine, theirs in zip(results[0], rank_params):
            np.testing.assert_array_equal(mine, theirs)


# ----------------------------------------------------------------------------- equivalence


@pytest.mark.parametrize("n", [2, 3, 4])
def test_equals_one_large_batch(group_factory, n):
    b, steps, seed = 5, 6, 11
    results = group_factory(n).run(train_data_parallel, b, steps, seed, 0.001, 0.0005)
    params = [r[0] for r in results]
    assert len(results[0][1]) > 1  # several buckets, so the ordering logic is exercised
    assert_replicas_identical(params)
    reference = train_reference(n, b, steps, seed)
    for got, want in zip(params[0], reference):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    # Training moved the parameters: the comparison above cannot pass vacuously.
    assert max(np.abs(g - w0).max() for g, w0 in zip(params[0], mlp_init(MLP_SIZES, seed))) > 1e-3


def test_bucket_size_does_not_change_the_result(group_factory):
    group = group_factory(3)
    b, steps, seed = 4, 5, 3
    n_params = 2 * (len(MLP_SIZES) - 1)
    runs = {}
    for bucket_mb, first_mb in [(1e-9, 1e-9), (0.001, 0.0005), (1000.0, 1000.0)]:
        results = group.run(train_data_parallel, b, steps, seed, bucket_mb, first_mb)
        assert_replicas_identical([r[0] for r in results])
        runs[bucket_mb] = results[0]
    assert len(runs[1e-9][1]) == n_params  # tiny: one parameter per bucket
    assert len(runs[1000.0][1]) == 1  # huge: one bucket
    reference = train_reference(3, b, steps, seed)
    for params, _ in runs.values():
        for got, want in zip(params, reference):
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


# ----------------------------------------------------------------------------- step semantics


def _int_grad(rank: int, index: int, micro: int, shape) -> np.ndarray:
    """Small integers: sums and halves are exact in every float dtype used here."""
    return np.full(shape, float((rank + 1) * (micro + 2) + index), dtype=np.float64)


SHAPES = [(5,), (2, 3), (4,), (3, 3)]


def no_sync_rank(comm, average: bool):
    bucketer = GradientBucketer(comm, bucket_mb=1e-9, first_bucket_mb=1e-9, average=average)
    big = GradientBucketer(comm, bucket_mb=1e-9, first_bucket_mb=1e-9, average=average)
    handles = [bucketer.register(f"p{i}", s, np.float64) for i, s in enumerate(SHAPES)]
    for i, s in enumerate(SHAPES):
        big.register(f"p{i}", s, np.float64)
    # One synchronised step first fixes the plan, so the no_sync block below must not
    # communicate at all.
    for h in reversed(handles):
        bucketer.ready(h, np.zeros(SHAPES[h]))
    bucketer.wait()
    ops = comm.stats()["ops"]
    with bucketer.no_sync():
        for micro in range(2):
            for h in reversed(handles):
                bucketer.ready(h, _int_grad(comm.rank, h, micro, SHAPES[h]))
        bucketer.wait()  # a no-op inside no_sync
    ops_in_no_sync = comm.stats()["ops"] - ops
    last = [_int_grad(comm.rank, h, 2, SHAPES[h]) for h in handles]
    for h in reversed(handles):
        bucketer.ready(h, last[h])
    bucketer.wait()
    # The same gradients summed by the caller and reduced in one step.
    summed = [sum(_int_grad(comm.rank, h, m, SHAPES[h]) for m in range(3)) for h in handles]
    for h in reversed(handles):
        big.ready(h, summed[h])
    big.wait()
    return ops_in_no_sync, last, summed


@pytest.mark.parametrize("average", [True, False])
def test_no_sync_accumulation_equals_one_big_step(group_factory, average):
    n = 3
    results = group_factory(n).run(no_sync_rank, average)
    for ops_in_no_sync, last, summed in results:
        assert ops_in_no_sync == 0
        for h, shape in enumerate(SHAPES):
            np.testing.assert_array_equal(last[h], summed[h])
            total = sum(_int_grad(r, h, m, shape) for r in range(n) for m in range(3))
            want = total / n if average else total
            np.testing.assert_allclose(last[h], want, rtol=1e-14)


def unused_rank(comm):
    bucketer = GradientBucketer(comm, bucket_mb=1e-9, first_bucket_mb=1e-9, average=False)
    handles = [bucketer.register(f"p{i}", s, np.float64) for i, s in enumerate(SHAPES)]
    steps = []
    for step in range(3):
        # Step 0: rank r skips parameter r. Step 1: rank 0 hands over nothing at all.
        # Step 2: everyone uses everything (stale zeros must not leak into it).
        skip = {0: {comm.rank}, 1: set(handles) if comm.rank == 0 else set(), 2: set()}[step]
        grads = {h: _int_grad(comm.rank, h, step, SHAPES[h]) for h in handles if h not in skip}
        for h in reversed(handles):
            if h in grads:
                bucketer.ready(h, grads[h])
        bucketer.wait()
        steps.append(grads)
    return steps


def test_unused_parameters_contribute_zeros(group_factory):
    n = 3
    results = group_factory(n).run(unused_rank, timeout=60)
    skips = [lambda r: {r}, lambda r: set(range(len(SHAPES))) if r == 0 else set(), lambda r: set()]
    for rank, steps in enumerate(results):
        for step, grads in enumerate(steps):
            assert set(grads) == set(range(len(SHAPES))) - skips[step](rank)
            for h, got in grads.items():
                want = sum(
                    _int_grad(r, h, step, SHAPES[h]) for r in range(n) if h not in skips[step](r)
                )
                np.testing.assert_array_equal(got, want)


def any_order_rank(comm, seed: int):
    """Each rank hands its gradients over in its own random order."""
    bucketer = GradientBucketer(comm, bucket_mb=1e-9, first_bucket_mb=1e-9, average=False)
    handles = [bucketer.register(f"p{i}", (4,), np.float64) for i in range(6)]
    order = np.random.default_rng([seed, comm.rank]).permutation(len(handles))
    grads = [np.full(4, float(100 * i + comm.rank)) for i in handles]
    for h in order:
        bucketer.ready(handles[h], grads[h])
    bucketer.wait()
    return grads


def test_buckets_launch_in_plan_order_whatever_order_grads_arrive(group_factory):
    # Equal-sized buckets: launching them in arrival order would pair different
    # parameters across ranks and give silently wrong sums, not an error.
    n = 3
    for seed in range(3):
        for grads in group_factory(n).run(any_order_rank, seed):
            for i, g in enumerate(grads):
                np.testing.assert_array_equal(g, np.full(4, float(n * 100 * i + n * (n - 1) / 2)))


def double_ready_rank(comm):
    bucketer = GradientBucketer(comm, bucket_mb=1e-9, first_bucket_mb=1e-9, average=False)
    h0 = bucketer.register("w", (3,), np.float64)
    h1 = bucketer.register("b", (2,), np.float64)
    g0, g1 = np.ones(3), np.ones(2)
    bucketer.ready(h1, g1)
    try:
        bucketer.ready(h1, np.ones(2))
    except ValueError as exc:
        message = str(exc)
    else:
        message = None
    bucketer.ready(h0, g0)
    bucketer.wait()  # the step still completes, with the first gradient
    return message, g0, g1


def test_double_ready_raises_value_error(group_factory):
    for message, g0, g1 in group_factory(2).run(double_ready_rank):
        assert message is not None and "'b'" in message and "twice" in message
        np.testing.assert_array_equal(g0, [2.0, 2.0, 2.0])
        np.testing.assert_array_equal(g1, [2.0, 2.0])


# ----------------------------------------------------------------------------- plan check


def mismatch_rank(comm, case: str):
    bucket_mb = 2.0 if (case == "settings" and comm.rank == 0) else 25.0
    bucketer = GradientBucketer(comm, bucket_mb=bucket_mb)
    bucketer.register("w", (3, 2), np.float32)
    if case == "shape" and comm.rank == 1:
        bucketer.register("b", (4,), np.float32)
    else:
        bucketer.register("b", (2,), np.float32)
    if case == "count" and comm.rank == 2:
        bucketer.register("extra", (1,), np.float32)
    if case == "name" and comm.rank == 2:
        bucketer.register("head", (5,), np.float32)
    else:
        bucketer.register("out", (5,), np.float32)
    outcome = "ok"
    try:
        bucketer.ready(0, np.ones((3, 2), np.float32))
        bucketer.wait()
    except rr.MismatchError as exc:
        outcome = str(exc)
    # The check used ordinary collectives, so the communicator is still healthy.
    check = comm.all_reduce(np.ones(4, np.float32))
    return outcome, check


@pytest.mark.parametrize(
    "case,names,ranks",
    [
        ("shape", ["'b'"], "rank 1"),
        ("count", ["'extra'", "'out'"], "rank 2"),
        ("name", ["'head'", "'out'"], "rank 2"),
        ("settings", ["bucket_mb"], "rank 0"),
    ],
)
def test_plan_mismatch_raises_on_every_rank(group_factory, case, names, ranks):
    results = group_factory(3).run(mismatch_rank, case, timeout=60)
    messages = [outcome for outcome, _ in results]
    assert len(set(messages)) == 1, messages  # every rank names the same difference
    for name in names:
        assert name in messages[0], messages[0]
    assert ranks in messages[0], messages[0]
    for _, check in results:
        np.testing.assert_array_equal(check, np.full(4, 3.0, np.float32))


def test_first_difference_names_parameter_and_ranks():
    base = ['["<settings>", {}]', '["w", [2], "float32"]', '["b", [3], "float32"]']
    other = base[:2] + ['["b", [4], "float32"]']
    text = first_difference([base, base, other, other])
    assert "parameter #1" in text and "'b'" in text
    assert "ranks 0, 1" in text and "ranks 2, 3" in text and "(4,)" in text
    shorter = first_difference([base, base[:2]])
    assert "fewer registered" in shorter and "rank 1" in shorter


# ----------------------------------------------------------------------------- plan, locally


def test_plan_buckets_caps_and_order():
    f32 = np.dtype(np.float32)
    sizes = [400, 400, 4000, 100, 100]  # registration order
    plan = plan_buckets(sizes, [f32] * 5, first_bucket_bytes=250, bucket_bytes=1000)
    # Reversed order; first bucket <= 250 bytes, then <= 1000, the oversize one alone.
    assert plan == [[4, 3], [2], [1, 0]]
    mixed = plan_buckets([8, 8, 8], [f32, np.dtype(np.float64), f32], 100, 100)
    assert mixed == [[2], [1], [0]]  # one dtype per bucket
    assert plan_buckets([], [], 1, 1) == []


def _fake_comm(world_size: int = 1):
    return types.SimpleNamespace(rank=0, world_size=world_size)


def test_register_validates_locally():
    bucketer = GradientBucketer(_fake_comm(), bucket_mb=25.0, first_bucket_mb=1.0)
    h = bucketer.register("w", (4, 4), "float32")
    with pytest.raises(ValueError, match="twice"):
        bucketer.register("w", (4,), "float32")
    with pytest.raises(TypeError, match="floating"):
        bucketer.register("steps", (1,), np.int64)  # average=True needs floats
    with pytest.raises(ValueError, match="shape"):
        bucketer.ready(h, np.ones((4, 5), np.float32))
    with pytest.raises(TypeError, match="dtype"):
        bucketer.ready(h, np.ones((4, 4), np.float64))
    with pytest.raises(ValueError, match="read-only"):
        frozen = np.ones((4, 4), np.float32)
        frozen.flags.writeable = False
        bucketer.ready(h, frozen)
    with pytest.raises(ValueError, match="handle"):
        bucketer.ready(7, np.ones(1))
    with pytest.raises(ValueError):
        GradientBucketer(_fake_comm(), bucket_mb=0)
    assert bucketer.plan == [["w"]]


def test_importing_ringreduce_does_not_import_torch():
    code = (
        "import sys, ringreduce, ringreduce.bucketing; "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# ----------------------------------------------------------------------------- dtypes, trees


def bf16_rank(comm):
    bucketer = GradientBucketer(comm, bucket_mb=1e-9, first_bucket_mb=1e-9, comm_dtype="bfloat16")
    grads = [np.full(s, float(comm.rank + 1 + i), np.float32) for i, s in enumerate(SHAPES)]
    handles = [bucketer.register(f"p{i}", s, np.float32) for i, s in enumerate(SHAPES)]
    for h in reversed(handles):
        bucketer.ready(h, grads[h])
    bucketer.wait()
    return grads, bucketer.summary()["bytes_per_step"]


def test_comm_dtype_bfloat16_on_the_wire(group_factory):
    pytest.importorskip("ml_dtypes")
    n = 2
    for grads, wire_bytes in group_factory(n).run(bf16_rank):
        assert wire_bytes == 2 * sum(int(np.prod(s)) for s in SHAPES)
        for i, g in enumerate(grads):
            assert g.dtype == np.float32
            np.testing.assert_array_equal(g, np.full(SHAPES[i], i + (n + 1) / 2, np.float32))


Pair = namedtuple("Pair", "left right")


def tree_rank(comm):
    bucketer = GradientBucketer(comm, bucket_mb=1e-9, first_bucket_mb=1e-9)
    value = float(comm.rank + 1)
    frozen = np.full(3, value)
    frozen.flags.writeable = False
    tree = OrderedDict(
        w=np.full((2, 3), value),
        layers=[np.full(4, 2 * value), Pair(np.full((2, 2), 3 * value), None)],
        frozen=frozen,
    )
    first = bucketer.all_reduce_tree(tree)
    second = bucketer.all_reduce_tree(tree)  # the registrations are reused
    same = [
        first["w"] is tree["w"],
        first["layers"][0] is tree["layers"][0],
        first["frozen"] is tree["frozen"],
    ]
    return (
        first,
        same,
        type(first).__name__,
        type(first["layers"][1]).__name__,
        bucketer.plan,
        second["frozen"],
    )


def test_all_reduce_tree(group_factory):
    n = 2
    mean = (n + 1) / 2
    for first, same, kind, pair_kind, plan, second_frozen in group_factory(n).run(tree_rank):
        assert kind == "OrderedDict" and pair_kind == "Pair"
        assert same == [True, True, False]  # writable leaves in place; read-only copied
        np.testing.assert_array_equal(first["w"], np.full((2, 3), mean))
        np.testing.assert_array_equal(first["layers"][0], np.full(4, 2 * mean))
        np.testing.assert_array_equal(first["layers"][1].left, np.full((2, 2), 3 * mean))
        assert first["layers"][1].right is None
        np.testing.assert_array_equal(first["frozen"], np.full(3, mean))
        np.testing.assert_array_equal(second_frozen, np.full(3, mean))  # from the original
        assert sorted(name for bucket in plan for name in bucket) == sorted(
            ["['w']", "['layers'][0]", "['layers'][1][0]", "['frozen']"]
        )


# ----------------------------------------------------------------------------- trace


def trace_rank(comm, directory: str, steps: int):
    bucketer = GradientBucketer(comm, bucket_mb=1e-9, first_bucket_mb=1e-9)
    handles = [bucketer.register(f"p{i}", s, np.float64) for i, s in enumerate(SHAPES)]
    for step in range(steps):
        for h in reversed(handles):
            bucketer.ready(h, _int_grad(comm.rank, h, step, SHAPES[h]))
        bucketer.wait()
    path = os.path.join(directory, f"trace{comm.rank}.json")
    bucketer.save_trace(path)
    return path, bucketer.summary()


def test_trace_has_one_event_per_bucket_per_step(group_factory, tmp_path):
    steps = 3
    for rank, (path, summary) in enumerate(group_factory(2).run(trace_rank, str(tmp_path), steps)):
        with open(path, encoding="utf-8") as f:
            trace = json.load(f)
        events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
        assert len(events) == steps * len(SHAPES)
        assert sorted((e["args"]["step"], e["args"]["bucket"]) for e in events) == [
            (s, b) for s in range(steps) for b in range(len(SHAPES))
        ]
        for e in events:
            assert e["pid"] == rank and e["dur"] >= 0
            assert e["args"]["nbytes"] == 8 * int(np.prod(SHAPES[::-1][e["args"]["bucket"]]))
            assert e["args"]["launch"] >= e["args"]["last_ready"] >= e["args"]["first_ready"]
        assert summary["steps"] == steps and summary["buckets"] == len(SHAPES)
        assert 0 <= summary["exposed_s"] and 0 <= summary["comm_s"]
        assert summary["bytes_per_step"] == 8 * sum(int(np.prod(s)) for s in SHAPES)
