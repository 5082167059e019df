"""What a CUDA build of the extension must contain, checked without a GPU.

When build_info()["cuda"] is True: machine code for sm_80 and sm_90 plus PTX,
and no dynamic dependency on the CUDA runtime or driver, so the module imports
on machines without either. Without a usable device the CUDA entry points must
say so instead of failing obscurely.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sysconfig

import numpy as np
import pytest

import ringreduce as rr
from ringreduce import _core
from ringreduce._arrays.cuda import DeviceBuffer, cuda_available

CUDA_BUILD = bool(rr.build_info()["cuda"])
needs_cuda_build = pytest.mark.skipif(
    not CUDA_BUILD,
    reason="needs the CUDA build: reinstall ringreduce with the CUDA toolkit (nvcc) on PATH",
)


def find_cuobjdump() -> str | None:
    """cuobjdump from PATH, the toolkit, or the nvidia-cuda-cuobjdump wheel."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    wheel_bin = os.path.join(sysconfig.get_paths()["purelib"], "nvidia", "*", "bin")
    patterns = ["/usr/local/cuda*/bin/cuobjdump", os.path.join(wheel_bin, "cuobjdump")]
    for pattern in patterns:
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[-1]
    return None


def cuobjdump() -> str:
    """find_cuobjdump(), or skips the test that needs it."""
    tool = find_cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump not found (pip install nvidia-cuda-cuobjdump)")
    return tool


def run_tool(*args: str) -> str:
    return subprocess.run(args, check=True, capture_output=True, text=True, timeout=120).stdout


@needs_cuda_build
def test_fatbinary_has_sm80_sm90_and_ptx():
    tool = cuobjdump()
    elf = run_tool(tool, "--list-elf", _core.__file__)
    ptx = run_tool(tool, "--list-ptx", _core.__file__)
    assert "sm_80" in elf and "sm_90" in elf, elf
    assert "sm_90" in ptx, ptx


@needs_cuda_build
def test_cuda_runtime_is_linked_statically():
    if shutil.which("ldd") is None:
        pytest.skip("needs ldd: apt-get install libc-bin")
    needed = run_tool("ldd", _core.__file__)
    assert "libcudart" not in needed and "libcuda." not in needed, needed


@needs_cuda_build
def test_static_runtime_symbols_are_not_exported():
    # They would otherwise be candidates for torch's or cupy's libcudart calls.
    if shutil.which("nm") is None:
        pytest.skip("needs nm: apt-get install binutils")
    symbols = run_tool("nm", "-D", "--defined-only", _core.__file__).split()
    assert not [s for s in symbols if s.startswith("cuda")]


def test_without_a_device_cuda_calls_report_it():
    if cuda_available():
        pytest.skip("checks the machine without a GPU: run with CUDA_VISIBLE_DEVICES= to hide it")
    assert _core.cuda_device_count() == 0
    x = np.zeros(4, dtype=np.float32)
    with pytest.raises(rr.RingReduceError):
        _core.testing.cuda_reduce(2, 0, x.ctypes.data, x.ctypes.data, x.ctypes.data, 4)
    with pytest.raises(rr.RingReduceError):
        DeviceBuffer(16)


def test_bad_codes_are_value_errors_in_a_cuda_build():
    if not CUDA_BUILD:
        pytest.skip(
            "needs the CUDA build: reinstall ringreduce with the CUDA toolkit (nvcc) on PATH"
        )
    with pytest.raises(ValueError):
        _core.testing.cuda_reduce(99, 0, 0, 0, 0, 1)
    with pytest.raises(ValueError):
        _core.testing.cuda_reduce(2, 99, 0, 0, 0, 1)
    with pytest.raises(ValueError):
        _core.testing.cuda_divide(6, 0, 1, 2)


def ptx_kernels(marker: str) -> dict:
    """{mangled name: PTX body} of the extension's kernels whose name holds `marker`."""
    ptx = run_tool(cuobjdump(), "--dump-ptx", _core.__file__)
    entries = {}
    for chunk in ptx.split(".entry ")[1:]:
        name = chunk.split("(", 1)[0]
        if marker in name:
            entries[name] = chunk.split("\n}\n", 1)[0]
    return entries


@needs_cuda_build
def test_codec_kernels_are_built_without_fused_multiply_adds():
    # A fused multiply-add rounds once where the CPU loops round twice: the bits would
    # differ from theirs (docs/compression.md, "Device arrays").
    entries = ptx_kernels("5codec7kernels")
    kinds = {
        k for k in ("encode_kernel", "decode_kernel", "convert_kernel") for n in entries if k in n
    }
    assert kinds == {"encode_kernel", "decode_kernel", "convert_kernel"}, sorted(entries)
    fused = [n for n, body in entries.items() if "fma." in body]
    assert not fused, fused


@needs_cuda_build
def test_reduce_all_kernels_exist_for_every_dtype_and_op_without_fused_multiply_adds():
    # The device window path's one kernel must give the CPU's reduce_all bits: every
    # (dtype x op) instantiated, and no multiply-add fused where the CPU rounds twice.
    entries = ptx_kernels("reduce_all_kernel")
    # One PTX entry per (dtype x op): the build carries PTX for sm_90 only.
    assert len(entries) == 8 * 4, sorted(entries)
    fused = [n for n, body in entries.items() if "fma." in body]
    assert not fused, fused
