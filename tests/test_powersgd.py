"""PowerSGD over a communicator (ringreduce.compression.powersgd).

Rank-side functions are module level so the rank processes can unpickle them. Gradients
come from (seed, rank) alone. Bounds: float32 arithmetic, so "exact" means a relative
error of 1e-5 against a float64 numpy reference; the tests that need equality (vectors of
small integers, bits across ranks, a state reloaded) compare with 0 ULP.
"""

from __future__ import annotations

import numpy as np
import pytest

from ringreduce.compression.powersgd import PowerSGD, orthogonalize


def _low_rank(seed: int, rank: int, n: int, m: int, k: int) -> np.ndarray:
    """Rank `rank`'s n x m gradient: U C_rank V^T with U, V shared, so the sum over the
    ranks has rank k."""
    shared = np.random.default_rng(seed)
    u, v = shared.standard_normal((n, k)), shared.standard_normal((m, k))
    c = np.random.default_rng([seed, rank]).standard_normal((k, k))
    return (u @ c @ v.T).astype(np.float32)


def _decaying(seed: int, rank: int, n: int, m: int) -> np.ndarray:
    """Rank `rank`'s gradient, full rank: mean + or - a shared full-rank D, so that the
    average over an even number of ranks is the mean, whose singular values are 8, 4, 2,
    1, ...: rank r approximations are far from exact, and power iteration converges fast."""
    shared = np.random.default_rng(seed)
    u, _ = np.linalg.qr(shared.standard_normal((n, min(n, m))))
    v, _ = np.linalg.qr(shared.standard_normal((m, min(n, m))))
    s = 8.0 * 0.5 ** np.arange(min(n, m))
    d = 0.3 * shared.standard_normal((n, m))
    return ((u * s) @ v.T + (d if rank % 2 else -d)).astype(np.float32)


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


# ---- rank-side functions ------------------------------------------------------------


def _exact_at_true_rank(comm, k, r):
    n = comm.world_size
    shapes = [(40, 24), (40, 24), (17, 30)]  # two of one shape: a batch
    grads = [_low_rank(7 + i, comm.rank, a, b, k) for i, (a, b) in enumerate(shapes)]
    want = [
        sum(_low_rank(7 + i, q, a, b, k).astype(np.float64) for q in range(n)) / n
        for i, (a, b) in enumerate(shapes)
    ]
    ps = PowerSGD(comm, rank=r, min_compression_rate=1)
    got = ps.reduce(grads, ["w0", "w1", "w2"])
    return [_rel(g, w) for g, w in zip(got, want)], ps.stats()


def _same_bits(comm):
    rng = np.random.default_rng([3, comm.rank])
    grads = [
        rng.standard_normal(s).astype(np.float32) for s in [(64, 32), (64, 32), (9,), (20, 3, 3, 3)]
    ]
    ps = PowerSGD(comm, rank=3)
    out = []
    for _ in range(3):
        out += [g.copy() for g in ps.reduce([g.copy() for g in grads], ["a", "b", "c", "d"])]
    return np.concatenate([o.reshape(-1) for o in out]).tobytes()


def _vectors_exact(comm, start_iter):
    # Small integers in float32: the average of 2 ranks' sums is exact.
    r = comm.rank
    grads = [
        np.full(11, r + 1, np.float32),
        np.arange(12, dtype=np.float32).reshape(3, 4) * r,
        np.full((), 2.0 * r, np.float32),
        np.full((32, 16), r, np.float32),
    ]
    ps = PowerSGD(comm, rank=1, start_iter=start_iter)
    out = ps.reduce(grads, ["bias", "tiny", "scalar", "big"])
    return [o.copy() for o in out], ps.stats()


def _best_rank_error(g: np.ndarray, r: int) -> float:
    u, s, vt = np.linalg.svd(g.astype(np.float64))
    return _rel((u[:, :r] * s[:r]) @ vt[:r], g.astype(np.float64))


def _warm_start(comm, warm):
    n = comm.world_size
    want = sum(_decaying(5, q, 48, 32).astype(np.float64) for q in range(n)) / n
    ps = PowerSGD(comm, rank=2, warm_start=warm, error_feedback=False)
    errors, outs = [], []
    for _ in range(6):
        (out,) = ps.reduce([_decaying(5, comm.rank, 48, 32)], ["w"])
        errors.append(_rel(out, want))
        outs.append(out.copy())
    return errors, _best_rank_error(want, 2), outs


def _error_feedback(comm, feedback, steps):
    """The relative error of the first step, and of the mean of the first K steps for K
    in 10, 20, 40, ... up to steps, of one gradient given again and again."""
    n = comm.world_size
    want = sum(_decaying(11, q, 40, 40).astype(np.float64) for q in range(n)) / n
    ps = PowerSGD(comm, rank=1, error_feedback=feedback, warm_start=True)
    total = np.zeros((40, 40))
    means = []
    for k in range(1, steps + 1):
        (out,) = ps.reduce([_decaying(11, comm.rank, 40, 40)], ["w"])
        total += out
        if k == 1 or (k % 10 == 0 and (k // 10) & (k // 10 - 1) == 0):
            means.append(_rel(total / k, want))
    return means


def _state_round_trip(comm):
    rng = np.random.default_rng([9, comm.rank])
    f32 = np.float32
    steps = [
        [rng.standard_normal((30, 20)).astype(f32), rng.standard_normal(5).astype(f32)]
        for _ in range(5)
    ]
    names = ["w", "b"]
    ps = PowerSGD(comm, rank=2, start_iter=1)
    for grads in steps[:3]:
        ps.reduce([g.copy() for g in grads], names)
    saved = ps.state_dict()
    after = [ps.reduce([g.copy() for g in grads], names) for grads in steps[3:]]
    again = PowerSGD(comm, rank=2, start_iter=1)
    again.load_state_dict(saved)
    replay = [again.reduce([g.copy() for g in grads], names) for grads in steps[3:]]
    same = all(np.array_equal(a, b) for x, y in zip(after, replay) for a, b in zip(x, y))
    errors = []
    for bad in ({**saved, "rank": 3}, {**saved, "version": 7}):
        try:
            PowerSGD(comm, rank=2).load_state_dict(bad)
        except ValueError as exc:
            errors.append(str(exc))
    return same, sorted(saved["residuals"]), errors


def _pipelined(comm):
    """Two calls in flight at once give what two calls one after the other give; the
    second call's start moved the first on to its Q all-reduce."""
    rng = np.random.default_rng([4, comm.rank])
    a = [
        rng.standard_normal((24, 16)).astype(np.float32),
        rng.standard_normal(7).astype(np.float32),
    ]
    b = [rng.standard_normal((33, 10)).astype(np.float32)]
    one = PowerSGD(comm, rank=2)
    seq = [x.copy() for x in one.reduce([x.copy() for x in a], ["a0", "a1"])]
    seq += [x.copy() for x in one.reduce([x.copy() for x in b], ["b0"])]
    two = PowerSGD(comm, rank=2)
    wa = two.start([x.copy() for x in a], ["a0", "a1"])
    stage_before = wa._stage
    wb = two.start([x.copy() for x in b], ["b0"])
    stage_after = wa._stage
    par = list(wa.wait()) + list(wb.wait())
    return stage_before, stage_after, all(np.array_equal(x, y) for x, y in zip(seq, par))


def _bytes(comm, r):
    """Engine bytes sent by one PowerSGD call against one exact all-reduce of the same
    gradients (a 512 x 512 matrix and a 512 vector)."""
    grads = [np.ones((512, 512), np.float32) * comm.rank, np.ones(512, np.float32)]
    comm.barrier()
    before = comm.stats()["bytes_sent"]
    comm.all_reduce(np.concatenate([g.reshape(-1) for g in grads]))
    exact = comm.stats()["bytes_sent"] - before
    ps = PowerSGD(comm, rank=r)
    before = comm.stats()["bytes_sent"]
    ps.reduce(grads, ["w", "b"])
    return exact, comm.stats()["bytes_sent"] - before, ps.stats()


# ---- tests ----------------------------------------------------------------------------


def test_orthogonalize_gives_orthonormal_columns_even_when_rank_deficient():
    rng = np.random.default_rng(0)
    p = rng.standard_normal((3, 50, 4)).astype(np.float32)
    p[1, :, 3] = p[1, :, 0] + 2 * p[1, :, 1]  # a column in the span of two others
    p[2, :, 2] = 0  # a zero column stays zero
    q = orthogonalize(p.copy())
    for b in range(2):
        assert np.abs(q[b].T @ q[b] - np.eye(4)).max() < 1e-5
    assert not np.isnan(q).any() and not q[2, :, 2].any()
    assert np.array_equal(q, orthogonalize(p.copy()))  # deterministic


@pytest.mark.parametrize("n,k,r", [(3, 2, 2), (2, 2, 4)])
def test_exact_when_rank_at_least_the_true_rank(group_factory, n, k, r):
    for errors, stats in group_factory(n).run(_exact_at_true_rank, k, r):
        assert max(errors) < 1e-5, errors
        assert stats["compressed"] == 3 and stats["exact"] == 0


def test_every_rank_gets_the_same_bits(group_factory):
    got = group_factory(3).run(_same_bits)
    assert got[0] == got[1] == got[2]


@pytest.mark.parametrize("start_iter", [0, 1])
def test_vectors_and_small_tensors_are_reduced_exactly(group_factory, start_iter):
    for out, stats in group_factory(2).run(_vectors_exact, start_iter):
        assert np.array_equal(out[0], np.full(11, 1.5, np.float32))
        assert np.array_equal(out[1], np.arange(12, dtype=np.float32).reshape(3, 4) * 0.5)
        assert out[2] == 1.0
        # The 32 x 16 matrix (rank 1 in sum): compressed once start_iter calls are over,
        # exact either way since its average 0.5 everywhere has rank 1.
        assert np.abs(out[3] - 0.5).max() < 1e-6
        assert stats["compressed"] == (1 if start_iter == 0 else 0)


def test_warm_start_converges_to_the_best_rank_r_approximation(group_factory):
    warm, cold = group_factory(2).run(_warm_start, True), group_factory(2).run(_warm_start, False)
    errors, best, _ = warm[0]
    assert errors[-1] < 1.02 * best < errors[0], (errors, best)
    cold_errors, _, cold_outs = cold[0]
    # Without warm start every step starts from the same seeded Q: the same result.
    assert all(np.array_equal(o, cold_outs[0]) for o in cold_outs)
    assert cold_errors[0] > 1.1 * best


def test_error_feedback_makes_the_sum_of_steps_converge(group_factory):
    with_ef = group_factory(2).run(_error_feedback, True, 80)[0]
    without = group_factory(2).run(_error_feedback, False, 80)[0]
    # One step of a rank-1 approximation loses half of this gradient. With error feedback
    # the sum of outputs telescopes to K x average - mean residual, so the mean of K steps
    # approaches the exact average as the residual stays bounded; without, it stays at the
    # best rank-1 error (0.5).
    assert with_ef[0] > 0.3 and without[0] > 0.3
    assert with_ef[-1] < 0.04 and with_ef[-1] < with_ef[-2] < with_ef[-3], with_ef
    assert min(without) > 0.45, without


def test_state_dict_round_trip_gives_the_same_bits(group_factory):
    for same, residual_names, errors in group_factory(2).run(_state_round_trip):
        assert same
        assert residual_names == ["w"]  # vectors have no residual
        assert len(errors) == 2 and "rank 3" in errors[0] and "version" in errors[1]


def test_a_second_call_overlaps_the_first(group_factory):
    for before, after, same in group_factory(2).run(_pipelined):
        assert (before, after, same) == (1, 2, True)


def test_bytes_on_the_wire(group_factory):
    for exact, compressed, stats in group_factory(2).run(_bytes, 4):
        # 512 x 512 at rank 4: P and Q are 2 x 512 x 4 floats instead of 512^2.
        assert stats["elements"] == 512 * 512 + 512
        assert stats["sent"] == 2 * 512 * 4 + 512
        assert compressed < exact / 30, (exact, compressed)


def test_bad_arguments():
    class Comm:
        world_size = 1

    with pytest.raises(ValueError, match="rank"):
        PowerSGD(Comm(), rank=0)
    with pytest.raises(ValueError, match="distinct name"):
        PowerSGD(Comm()).start([np.zeros(3, np.float32)] * 2, ["a", "a"])
