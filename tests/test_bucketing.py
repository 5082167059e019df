"""GradientBucketer: equivalence with one large batch, no_sync, unused parameters and the
launch order, with gradients in host memory and on the (fake) device.

Rank-side functions are module level so the spawned rank processes can unpickle them.
Expected values come from rank and world size alone; sums of small integers compare
exactly, random float64 training compares with a reference to 1e-12. On the fake device
(tests/_fake_cuda.py) the gradients are FakeCudaArray, the buckets are allocated through
their ArrayKind and reduced by the engine's device executor, as CUDA gradients are.
"""

from __future__ import annotations

import numpy as np
import pytest
from _grads import MEMORY, SHAPES, handing_over, int_grad

import ringreduce as rr
from ringreduce.bucketing import GradientBucketer

from _ranks import free_port

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
    comm, b: int, steps: int, seed: int, bucket_mb: float, first_bucket_mb: float, memory: str
):
    """Rank side: SGD on this rank's rows, gradients averaged by a GradientBucketer.
    Returns the parameters, the plan, and how many arrays were allocated on the device."""
    bucketer = GradientBucketer(comm, bucket_mb=bucket_mb, first_bucket_mb=first_bucket_mb)
    params = mlp_init(MLP_SIZES, seed)
    handles = [bucketer.register(f"p{i}", p.shape, p.dtype) for i, p in enumerate(params)]
    rows = slice(comm.rank * b, (comm.rank + 1) * b)
    with handing_over(memory) as (wrap, kind):
        for step in range(steps):
            x, y = mlp_batch(step, comm.world_size * b, MLP_SIZES, seed)
            grads = mlp_backward(
                params, x[rows], y[rows], on_grad=lambda i, g: bucketer.ready(handles[i], wrap(g))
            )
            bucketer.wait()
            for p, g in zip(params, grads):
                p -= LR * g
    return params, bucketer.plan, kind.allocated if kind else 0


def assert_replicas_identical(results: list) -> None:
    for rank_params in results[1:]:
        for mine, theirs in zip(results[0], rank_params):
            np.testing.assert_array_equal(mine, theirs)


# ----------------------------------------------------------------------------- equivalence


@pytest.mark.parametrize("memory", MEMORY)
@pytest.mark.parametrize("n", [2, 3, 4])
def test_equals_one_large_batch(group_factory, n, memory):
    b, steps, seed = 5, 6, 11
    group = group_factory(n, fake_device=memory != "host")
    results = group.run(train_data_parallel, b, steps, seed, 0.001, 0.0005, memory)
    params = [r[0] for r in results]
    assert len(results[0][1]) > 1  # several buckets, so the ordering logic is exercised
    if memory != "host":  # every bucket was allocated on the device, once
        assert [r[2] for r in results] == [len(results[0][1])] * n
    assert_replicas_identical(params)
    reference = train_reference(n, b, steps, seed)
    for got, want in zip(params[0], reference):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    # Training moved the parameters: the comparison above cannot pass vacuously.
    assert max(np.abs(g - w0).max() for g, w0 in zip(params[0], mlp_init(MLP_SIZES, seed))) > 1e-3


@pytest.mark.parametrize("memory", MEMORY)
def test_bucket_size_does_not_change_the_result(group_factory, memory):
    group = group_factory(3, fake_device=memory != "host")
    b, steps, seed = 4, 5, 3
    n_params = 2 * (len(MLP_SIZES) - 1)
    runs = {}
    for bucket_mb, first_mb in [(1e-9, 1e-9), (0.001, 0.0005), (1000.0, 1000.0)]:
        results = group.run(train_data_parallel, b, steps, seed, bucket_mb, first_mb, memory)
        assert_replicas_identical([r[0] for r in results])
        runs[bucket_mb] = results[0]
    assert len(runs[1e-9][1]) == n_params  # tiny: one parameter per bucket
    assert len(runs[1000.0][1]) == 1  # huge: one bucket
    reference = train_reference(3, b, steps, seed)
    for params, _, _ in runs.values():
        for got, want in zip(params, reference):
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


# ----------------------------------------------------------------------------- step semantics


def no_sync_rank(comm, average: bool, memory: str):
    bucketer = GradientBucketer(comm, bucket_mb=1e-9, first_bucket_mb=1e-9, average=average)
    big = GradientBucketer(comm, bucket_mb=1e-9, first_bucket_mb=1e-9, average=average)
    handles = [bucketer.register(f"p{i}", s, np.float64) for i, s in enumerate(SHAPES)]
    for i, s in enumerate(SHAPES):
        big.register(f"p{i}", s, np.float64)
    with handing_over(memory) as (wrap, _):
        # One synchronised step first fixes the plan, so the no_sync block below must not
        # communicate at all.
        for h in reversed(handles):
            bucketer.ready(h, wrap(np.zeros(SHAPES[h])))
        bucketer.wait()
        ops = comm.stats()["ops"]
        with bucketer.no_sync():
            for micro in range(2):
                for h in reversed(handles):
                    bucketer.ready(h, wrap(int_grad(comm.rank, h, micro, SHAPES[h])))
            bucketer.wait()  # a no-op inside no_sync
        ops_in_no_sync = comm.stats()["ops"] - ops
        last = [int_grad(comm.rank, h, 2, SHAPES[h]) for h in handles]
        for h in reversed(handles):
            bucketer.ready(h, wrap(last[h]))
        bucketer.wait()
        # The same gradients summed by the caller and reduced in one step.
        summed = [sum(int_grad(comm.rank, h, m, SHAPES[h]) for m in range(3)) for h in handles]
        for h in reversed(handles):
            big.ready(h, wrap(summed[h]))
        big.wait()
    return ops_in_no_sync, last, summed


@pytest.mark.parametrize("memory", MEMORY)
@pytest.mark.parametrize("average", [True, False])
def test_no_sync_accumulation_equals_one_big_step(group_factory, average, memory):
    n = 3
    results = group_factory(n, fake_device=memory != "host").run(no_sync_rank, average, memory)
    for ops_in_no_sync, last, summed in results:
        assert ops_in_no_sync == 0
        for h, shape in enumerate(SHAPES):
            np.testing.assert_array_equal(last[h], summed[h])
            total = sum(int_grad(r, h, m, shape) for r in range(n) for m in range(3))
            want = total / n if average else total
            np.testing.assert_allclose(last[h], want, rtol=1e-14)


def unused_rank(comm, memory: str):
    bucketer = GradientBucketer(comm, bucket_mb=1e-9, first_bucket_mb=1e-9, average=False)
    handles = [bucketer.register(f"p{i}", s, np.float64) for i, s in enumerate(SHAPES)]
    steps = []
    for step in range(3):
        # Step 0: rank r skips parameter r. Step 1: rank 0 hands over nothing at all.
        # Step 2: everyone uses everything (stale zeros must not leak into it).
        skip = {0: {comm.rank}, 1: set(handles) if comm.rank == 0 else set(), 2: set()}[step]
        grads = {h: int_grad(comm.rank, h, step, SHAPES[h]) for h in handles if h not in skip}
        with handing_over(memory) as (wrap, _):
            for h in reversed(handles):
                if h in grads:
                    bucketer.ready(h, wrap(grads[h]))
            bucketer.wait()
        steps.append(grads)
    return steps


@pytest.mark.parametrize("memory", MEMORY)
def test_unused_parameters_contribute_zeros(group_factory, memory):
    n = 3
    results = group_factory(n, fake_device=memory != "host").run(unused_rank, memory, timeout=60)
    skips = [lambda r: {r}, lambda r: set(range(len(SHAPES))) if r == 0 else set(), lambda r: set()]
    for rank, steps in enumerate(results):
        for step, grads in enumerate(steps):
            assert set(grads) == set(range(len(SHAPES))) - skips[step](rank)
            for h, got in grads.items():
                want = sum(
                    int_grad(r, h, step, SHAPES[h]) for r in range(n) if h not in skips[step](r)
                )
                np.testing.assert_array_equal(got, want)


def any_order_rank(comm, seed: int, memory: str):
    """Each rank hands its gradients over in its own random order."""
    bucketer = GradientBucketer(comm, bucket_mb=1e-9, first_bucket_mb=1e-9, average=False)
    handles = [bucketer.register(f"p{i}", (4,), np.float64) for i in range(6)]
    order = np.random.default_rng([seed, comm.rank]).permutation(len(handles))
    grads = [np.full(4, float(100 * i + comm.rank)) for i in handles]
    with handing_over(memory) as (wrap, _):
        for h in order:
            bucketer.ready(handles[h], wrap(grads[h]))
        bucketer.wait()
    return grads


@pytest.mark.parametrize("memory", MEMORY)
def test_buckets_launch_in_plan_order_whatever_order_grads_arrive(group_factory, memory):
    # Equal-sized buckets: launching them in arrival order would pair different
    # parameters across ranks and give silently wrong sums, not an error.
    n = 3
    for seed in range(3):
        for grads in group_factory(n, fake_device=memory != "host").run(
            any_order_rank, seed, memory
        ):
            for i, g in enumerate(grads):
                np.testing.assert_array_equal(g, np.full(4, float(n * 100 * i + n * (n - 1) / 2)))


# ----------------------------------------------------------------------------- write-back


class _DoublingComm:
    """A one-rank communicator whose asynchronous all_reduce "adds a second rank's equal
    contribution" (doubles the bucket) when waited for, and records, at each wait, which
    gradients already hold their reduced value."""

    def __init__(self, comm, grads: list) -> None:
        self._comm, self._grads, self.seen = comm, grads, []

    def __getattr__(self, name: str):
        return getattr(self._comm, name)

    def all_reduce(self, buf, op="sum", out=None, async_op=False):
        if not async_op:
            return self._comm.all_reduce(buf, op=op, out=out)
        outer = self

        class Work:
            def wait(self, timeout=None):
                outer.seen.append([bool(np.all(g == 2)) for g in outer._grads])
                np.multiply(buf, 2, out=buf)

            def done(self):
                return False

        return Work()


def test_each_bucket_is_written_back_once_done_before_the_next_wait():
    """As DDP's reducer does: the first bucket's gradients are already back in the arrays
    handed over when wait() waits for the second bucket, so the copy back overlaps the
    later buckets' reduction instead of following all of them."""
    grads = [np.ones(1 << 16, np.float32), np.ones(1 << 16, np.float32)]
    with rr.init("tcp", rank=0, world_size=1, master_port=free_port()) as comm:
        fake = _DoublingComm(comm, grads)
        # 256 KiB each, buckets of at most 0.25 MiB: one bucket per gradient.
        bucketer = GradientBucketer(fake, bucket_mb=0.25, first_bucket_mb=0.25, average=False)
        handles = [bucketer.register(f"p{i}", g.shape, g.dtype) for i, g in enumerate(grads)]
        assert len(bucketer.plan) == 2
        for i in reversed(range(2)):  # backward order: the last parameter first
            bucketer.ready(handles[i], grads[i])
        bucketer.wait()
    # The bucket of the last parameter launched first; when the second bucket is waited
    # for, the first one's gradient already holds its reduced value.
    assert fake.seen == [[False, False], [False, True]]
    assert all(np.all(g == 2) for g in grads)


# ----------------------------------------------------------------------------- windows


def windows_rank(comm, windows, memory="host"):
    """Three steps of small-integer gradients (exact in any order of summation) through
    buckets in windows or not, the gradients in host memory or on the (fake) device; the
    results, the window calls, where the buckets are, how many, and how many arrays the
    device's kind allocated."""
    with handing_over(memory) as (wrap, kind):
        bucketer = GradientBucketer(comm, bucket_mb=0.02, first_bucket_mb=0.01, windows=windows)
        shapes = [(64, 64), (4096,), (3000,), (7,)]
        handles = [bucketer.register(f"p{i}", s, np.float32) for i, s in enumerate(shapes)]
        before = comm.stats()["all_reduce_algorithms"].get("window", 0)
        results = []
        for step in range(3):
            grads = [
                ((np.arange(np.prod(s)) + comm.rank + step) % 11).astype(np.float32).reshape(s)
                for s in shapes
            ]
            for i in reversed(range(len(shapes))):
                bucketer.ready(handles[i], wrap(grads[i]))
            bucketer.wait()
            results.append([g.copy() for g in grads])
        used = comm.stats()["all_reduce_algorithms"].get("window", 0) - before
        allocated = kind.allocated if kind else 0
        return results, used, bucketer._in_windows, len(bucketer.plan), allocated


@pytest.mark.parametrize("n", [2, 3])
def test_buckets_in_windows_give_the_same_results(group_factory, n):
    """windows=None on shared memory puts the buckets in windows (their all-reduces take
    the window path); the results equal windows=False's bit for bit, and the average."""
    group = group_factory(n, transport="shm")
    auto = group.run(windows_rank, None)
    plain = group.run(windows_rank, False)
    for rank in range(n):
        results, used, in_windows, buckets, _ = auto[rank]
        assert in_windows and buckets > 1
        assert used >= 3 * 2, used  # the two buckets above 4 KiB per rank, every step
        assert not plain[rank][2] and plain[rank][1] == 0
        for step, grads in enumerate(results):
            for i, (mine, theirs) in enumerate(zip(grads, plain[rank][0][step])):
                np.testing.assert_array_equal(mine, theirs, err_msg=f"step {step} p{i}")
                size = mine.size
                summed = sum((np.arange(size) + r + step) % 11 for r in range(n))
                np.testing.assert_array_equal(mine.reshape(-1), (summed / n).astype(np.float32))


def test_windows_auto_is_off_over_tcp_and_forced_windows_still_reduce(group_factory):
    group = group_factory(2)  # TCP between the ranks: no windows to make
    auto = group.run(windows_rank, None)
    forced = group.run(windows_rank, True)
    for rank in range(2):
        assert not auto[rank][2] and auto[rank][1] == 0
        # Forced: allocated through comm.empty, which gives plain memory over TCP; the
        # results are the same.
        assert forced[rank][2] and forced[rank][1] == 0
        for a, b in zip(auto[rank][0], forced[rank][0]):
            for x, y in zip(a, b):
                np.testing.assert_array_equal(x, y)


def test_windows_refused_with_compression_and_bad_values():
    comm = rr.init("tcp", rank=0, world_size=1, master_port=free_port())
    try:
        with pytest.raises(ValueError, match="compress"):
            GradientBucketer(comm, windows=True, compression="int8")
        with pytest.raises(TypeError, match="windows must be"):
            GradientBucketer(comm, windows="yes")
    finally:
        comm.close()


def test_gpu_buckets_in_device_windows_when_asked(group_factory):
    """windows=True with GPU gradients: the buckets are device windows (comm.empty on
    the gradients' device, not the kind's allocations), every bucket's all-reduce takes
    the window path, and the results equal the host buckets' bit for bit. None leaves
    GPU buckets out of windows."""
    n = 3
    group = group_factory(n, fake_device=True, transport="shm")
    forced = group.run(windows_rank, True, "fake")
    auto = group.run(windows_rank, None, "fake")
    host = group.run(windows_rank, False)
    for rank in range(n):
        results, used, in_windows, buckets, allocated = forced[rank]
        assert in_windows and buckets > 1 and allocated == 0
        assert used == 3 * buckets, (used, buckets)
        assert not auto[rank][2] and auto[rank][1] == 0 and auto[rank][4] == buckets
        for step, grads in enumerate(results):
            for mine, theirs, plain in zip(grads, host[rank][0][step], auto[rank][0][step]):
                np.testing.assert_array_equal(mine, theirs)
                np.testing.assert_array_equal(mine, plain)
