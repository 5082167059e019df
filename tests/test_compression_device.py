"""Compressed collectives of device arrays, run on the fake device: the engine's Device is
the CPU emulation (tests/_fake_cuda.py), so every call takes the device route from the
Python API down: the engine's one-hop collective on the device executor (its codec
operations the Device's, csrc/executor/device_executor.h), the staging of the rows, the
conversions. The CUDA build runs the same route with the kernels of
csrc/kernels/codec_cuda.cu.

A device call must give the bits of the same call on host arrays (same call number, so
same seeds): every codec x dtype x size x collective x op, with and without a residual,
the residual left afterwards included."""

from __future__ import annotations

import _compression_device_rank as dr
import numpy as np
import pytest
from test_compression import _reference

# Sizes not divisible by the block (512) nor by the ranks; 1 leaves ranks without values.
SIZES = (1, 7, 1031, 3000)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_device_calls_give_the_host_calls_bits(group_factory, n):
    results = group_factory(n, fake_device=True).run(dr.device_matches_host, SIZES, timeout=240)
    for rank, got in enumerate(results):
        assert len(got) == 4 * 3 * len(SIZES) * 3 * 2 * 2
        wrong = [case for case, (same, residual, kept) in got.items() if not same]
        assert not wrong, f"rank {rank}: results differ from the host path's: {wrong[:6]}"
        wrong = [case for case, (same, residual, kept) in got.items() if not residual]
        assert not wrong, f"rank {rank}: residuals differ from the host path's: {wrong[:6]}"
        wrong = [case for case, (same, residual, kept) in got.items() if not kept]
        assert not wrong, f"rank {rank}: the input changed: {wrong[:6]}"


def test_device_calls_at_four_and_five_ranks(group_factory):
    for n in (4, 5):
        results = group_factory(n, fake_device=True).run(
            dr.device_matches_host, (5003,), ("float32", "bfloat16"), timeout=240
        )
        for rank, got in enumerate(results):
            assert all(all(v) for v in got.values()), (n, rank, got)


def test_device_error_feedback_converges_to_the_exact_sum(group_factory):
    n, calls = 4099, 32
    fed, unfed = group_factory(3, fake_device=True).run(dr.device_feedback_converges, n, calls)[0]
    exact = _reference(3, n, "float32")[1]
    err_fed = np.abs(fed - exact).max()
    err_unfed = np.abs(unfed - exact).max()
    # int4's rounding noise averages out either way; the residual returns the dropped
    # bits, so the mean with feedback is several times closer.
    assert err_fed < err_unfed / 4, (err_fed, err_unfed)


def test_device_paths_beside_the_codec(group_factory):
    results = group_factory(2, fake_device=True).run(dr.device_other_paths, 1031)
    for rank, got in enumerate(results):
        assert got == {
            "auto": True,
            ("exact", "float32"): (True, True),
            ("exact", "bfloat16"): (True, True),
            "async": True,
            "one_collective": True,
            "non_finite": True,
            "stats": True,
        }, rank


def test_device_calls_refuse_what_they_cannot_do(group_factory):
    results = group_factory(2, fake_device=True).run(dr.device_refusals)
    for got, _ in results:
        assert "no device kernels" in got["python_codec"] and "TypeError" in got["python_codec"]
        unknown = got["feedback_beside_unknown_arrays"]
        assert "TypeError" in unknown and "FakeCudaArray" in unknown, unknown
        assert "ValueError" in got["host_residual"] and "float32" in got["host_residual"]
        assert "ValueError" in got["short_residual"] and "100 values" in got["short_residual"]
        assert "int32" in got["integers"] and "floating-point" in got["integers"]
    assert results[0][1].tobytes() == results[1][1].tobytes()


def test_error_feedback_objects_keep_device_residuals_on_the_device(group_factory):
    for got in group_factory(2, fake_device=True).run(dr.device_feedback_objects, 2053, 3):
        assert got == {
            "results": True,
            "residuals": True,
            "norm": True,
            "kept": "FakeCudaArray",
            "restored": True,
            "moved": "FakeCudaArray",
        }
