"""GradientBucketer: its plan and the cross-rank check of it, local validation, comm dtypes,
gradient trees and the trace.

Rank-side functions are module level so the spawned rank processes can unpickle them.
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
from _grads import MEMORY, SHAPES, handing_over, int_grad

import ringreduce as rr
from ringreduce.bucketing import GradientBucketer
from ringreduce.bucketing.plan import first_difference, plan_buckets


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


def bf16_rank(comm, memory: str):
    bucketer = GradientBucketer(comm, bucket_mb=1e-9, first_bucket_mb=1e-9, comm_dtype="bfloat16")
    grads = [np.full(s, float(comm.rank + 1 + i), np.float32) for i, s in enumerate(SHAPES)]
    handles = [bucketer.register(f"p{i}", s, np.float32) for i, s in enumerate(SHAPES)]
    with handing_over(memory) as (wrap, _):
        for h in reversed(handles):
            bucketer.ready(h, wrap(grads[h]))
        bucketer.wait()
    return grads, bucketer.summary()["bytes_per_step"]


@pytest.mark.parametrize("memory", MEMORY)
def test_comm_dtype_bfloat16_on_the_wire(group_factory, memory):
    pytest.importorskip("ml_dtypes", reason="needs ml_dtypes: pip install -e '.[test]' brings it")
    n = 2
    group = group_factory(n, fake_device=memory != "host")
    for grads, wire_bytes in group.run(bf16_rank, memory):
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


def trace_rank(comm, directory: str, steps: int, memory: str):
    bucketer = GradientBucketer(comm, bucket_mb=1e-9, first_bucket_mb=1e-9)
    handles = [bucketer.register(f"p{i}", s, np.float64) for i, s in enumerate(SHAPES)]
    with handing_over(memory) as (wrap, _):
        for step in range(steps):
            for h in reversed(handles):
                bucketer.ready(h, wrap(int_grad(comm.rank, h, step, SHAPES[h])))
            bucketer.wait()
    path = os.path.join(directory, f"trace{comm.rank}.json")
    bucketer.save_trace(path)
    return path, bucketer.summary()


@pytest.mark.parametrize("memory", MEMORY)
def test_trace_has_one_event_per_bucket_per_step(group_factory, tmp_path, memory):
    steps = 3
    group = group_factory(2, fake_device=memory != "host")
    for rank, (path, summary) in enumerate(group.run(trace_rank, str(tmp_path), steps, memory)):
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
