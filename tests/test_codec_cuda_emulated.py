"""The CUDA codec kernels' source, run on the CPU: tests/codec_cuda_emulation.cc compiles
csrc/kernels/codec_cuda_kernels.cuh with the host compiler, each CUDA thread a host
thread (a barrier for __syncthreads), and the kernels' bytes are compared with the CPU
loops' (``_core.codec_*``): payloads, residuals, decodes and sums, bit for bit, on
blocks of zeros, of values below 2**-100 and with inf and nan, at sizes that end
mid-block. A GPU runs the same source (tests/test_cuda.py compares it there); this
checks its arithmetic and layout where there is none."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from _kernels import codec_values

from ringreduce import _core

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KINDS = {"bf16": 0, "fp16": 1, "int8": 2, "int4": 3}  # kernels/codec.h's CodecKind
SIZES = (1, 7, 512, 1031, 2053, 5000)
KEY = 0x0123_4567_89AB_CDEF


@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    source = os.path.join(ROOT, "csrc", "kernels", "codec_cuda_kernels.cuh")
    if not os.path.exists(source):
        pytest.skip("needs the source tree (csrc/): run from a checkout, not an installed wheel")
    compiler = shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        pytest.skip("needs a C++20 compiler (c++ or g++ on PATH)")
    lib = str(tmp_path_factory.mktemp("emulation") / "libcodec_cuda_emulation.so")
    cmd = [
        compiler,
        "-std=c++20",
        "-O2",
        "-ffp-contract=off",
        "-shared",
        "-fPIC",
        "-pthread",
        "-I",
        os.path.join(ROOT, "csrc"),
        os.path.join(ROOT, "tests", "codec_cuda_emulation.cc"),
        "-o",
        lib,
    ]
    built = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, f"{' '.join(cmd)}\n{built.stderr}"
    so = ctypes.CDLL(lib)
    p, size, i = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
    so.emulated_encode.argtypes = [i, p, p, i, size, ctypes.c_uint64, p, ctypes.c_uint64]
    so.emulated_decode_add.argtypes = [i, p, size, size, size, p, i]
    so.emulated_convert.argtypes = [i, i, p, p, size]
    return so


def _addr(a: np.ndarray) -> int:
    return a.ctypes.data


def _cpu_encode(codec, x, residual=None):
    payload = np.zeros(_core.codec_payload_bytes(codec, x.size), np.uint8)
    _core.codec_encode(codec, x, KEY, payload, residual)
    return payload


def _emulated_encode(so, codec, x, residual=None, out_only=False, first=0):
    payload = np.zeros(_core.codec_payload_bytes(codec, x.size), np.uint8)
    res = 0 if residual is None else _addr(residual)
    so.emulated_encode(
        KINDS[codec], _addr(x), res, int(out_only), x.size, KEY, _addr(payload), first
    )
    return payload


@pytest.mark.parametrize("codec", list(KINDS))
def test_a_piece_encodes_to_the_cpu_loops_bytes_at_its_index(emulated, codec):
    """``first``: a piece of an array, encoded at its index there (the dither's), gives
    the CPU loops' bytes for the same piece and index (the engine's pieces on a GPU)."""
    x = codec_values(4 * 512 + 77, 5)
    for first in (512, 3 * 512, (1 << 32) - 512, (1 << 32) + 1024):
        cpu = np.zeros(_core.codec_payload_bytes(codec, x.size), np.uint8)
        _core.codec_encode(codec, x, KEY, cpu, first=first)
        assert _emulated_encode(emulated, codec, x, first=first).tobytes() == cpu.tobytes(), first


@pytest.mark.parametrize("codec", list(KINDS))
def test_encode_gives_the_cpu_loops_bytes(emulated, codec):
    for n in SIZES:
        x = codec_values(n, n)
        assert _emulated_encode(emulated, codec, x).tobytes() == _cpu_encode(codec, x).tobytes(), n
        start = (np.random.default_rng(n + 1).standard_normal(n) * 1e-3).astype(np.float32)
        cpu_res, emu_res = start.copy(), start.copy()
        cpu = _cpu_encode(codec, x, cpu_res)
        emu = _emulated_encode(emulated, codec, x, emu_res)
        assert emu.tobytes() == cpu.tobytes(), f"n={n}: payload with a residual"
        assert emu_res.tobytes() == cpu_res.tobytes(), f"n={n}: residual"
        # Written only: x's own payload, and x minus its decode.
        emu_res = start.copy()
        emu = _emulated_encode(emulated, codec, x, emu_res, out_only=True)
        plain = _cpu_encode(codec, x)
        back = np.zeros(n, np.float32)
        _core.codec_decode(codec, plain, n, back)
        assert emu.tobytes() == plain.tobytes(), f"n={n}: payload, residual written only"
        with np.errstate(invalid="ignore"):  # inf - inf
            assert emu_res.tobytes() == (x - back).tobytes(), f"n={n}: residual written only"


@pytest.mark.parametrize("codec", list(KINDS))
def test_decode_and_decode_add_give_the_cpu_loops_bits(emulated, codec):
    for n in SIZES:
        payloads = [_cpu_encode(codec, codec_values(n, n) * np.float32(k + 1)) for k in range(3)]
        size = payloads[0].size
        stride = (size + 255) // 256 * 256
        staged = np.zeros(3 * stride, np.uint8)
        for j, p in enumerate(payloads):
            staged[j * stride : j * stride + size] = p
        want = np.zeros(n, np.float32)
        _core.codec_decode(codec, payloads[0], n, want)
        got = np.full(n, 7.0, np.float32)
        emulated.emulated_decode_add(KINDS[codec], _addr(staged), stride, 1, n, _addr(got), 0)
        assert got.tobytes() == want.tobytes(), f"n={n}: decode"
        acc = np.random.default_rng(n + 2).standard_normal(n).astype(np.float32)
        got = acc.copy()
        _core.codec_decode_add(codec, payloads, n, acc)
        emulated.emulated_decode_add(KINDS[codec], _addr(staged), stride, 3, n, _addr(got), 1)
        assert got.tobytes() == acc.tobytes(), f"n={n}: decode_add"


@pytest.mark.parametrize("half, dtype", [(0, np.float16), (1, ml_dtypes.bfloat16)])
def test_conversions_give_numpys_bits(emulated, half, dtype):
    x = codec_values(5000, 5000) * np.float32(3e4)  # past float16's range too
    with np.errstate(over="ignore"):
        want = x.astype(dtype)
    narrow = np.zeros(x.size, dtype)
    emulated.emulated_convert(half, 0, _addr(narrow), _addr(x), x.size)
    assert narrow.tobytes() == want.tobytes()
    wide = np.zeros(x.size, np.float32)
    emulated.emulated_convert(half, 1, _addr(wide), _addr(narrow), x.size)
    assert wide.tobytes() == narrow.astype(np.float32).tobytes()


def test_gpu_checks_codec_part_runs_on_the_emulated_device():
    """bench/gpu_check.py's codec part (bench/_gpu_codec_check.py) on the CPU emulation
    of the device: the script a GPU machine runs works, and finds nothing wrong."""
    script = os.path.join(ROOT, "bench", "_gpu_codec_check.py")
    if not os.path.exists(script):
        pytest.skip("needs the source tree (bench/)")
    done = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line.split() for line in done.stdout.splitlines() if line[:4] in KINDS]
    assert [r[0] for r in rows] == list(KINDS) and all(r[1] == "0" for r in rows), done.stdout
