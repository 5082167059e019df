"""gpu_check, part 4: the codec kernels of compressed all-reduce (csrc/kernels/codec_cuda.cu).

Each built-in codec encodes (with an error-feedback residual), decodes, and adds three
payloads on the GPU through ``_core.DeviceCodec``, on fresh random data with a block of
zeros, one of tiny values and one holding inf and nan; the payload bytes, the residual
and the sums must equal the CPU loops' bit for bit (``_core.codec_*``). Then each
codec's encode of 64 Mi float32 values (256 MiB, payload copied to the host as a
compressed call does) and decode_add of 3 payloads into device memory are timed, in
GB/s of float32 values. ``fake=True`` runs the same on the CPU emulation of the device
(host memory), to check this script where there is no GPU.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Tuple

import numpy as np

CODECS = ("bf16", "fp16", "int8", "int4")
KEY = 0x5EED_C0DE_0123_4567


def _values(n: int, rng: np.random.Generator) -> np.ndarray:
    x = rng.standard_normal(n).astype(np.float32)
    x[512:1024] = 0.0
    x[1024:1536] *= np.float32(2.0**-110)
    x[1600], x[1601], x[1602] = np.inf, -np.inf, np.nan
    return x


class _Memory:
    """Device memory from the extension, or host arrays standing in for it (fake)."""

    def __init__(self, device: int, fake: bool) -> None:
        self.device, self.fake, self.held = device, fake, []

    def put(self, host: np.ndarray) -> int:
        if self.fake:
            copy = np.array(host, copy=True)
            self.held.append(copy)
            return copy.ctypes.data
        from ringreduce._arrays.cuda import DeviceBuffer

        buf = DeviceBuffer.from_array(np.ascontiguousarray(host), self.device)
        self.held.append(buf)
        return buf.ptr

    def empty(self, nbytes: int) -> int:
        return self.put(np.zeros(nbytes, np.uint8))

    def get(self, ptr: int, dtype: Any, count: int) -> np.ndarray:
        for h in self.held:
            if (h.ctypes.data if self.fake else h.ptr) == ptr:
                nbytes = np.dtype(dtype).itemsize * count
                if self.fake:
                    return h.view(np.uint8)[:nbytes].view(dtype).copy()
                return h.download(dtype, count)
        raise KeyError(ptr)

    def close(self) -> None:
        if not self.fake:
            for h in self.held:
                h.close()
        self.held.clear()


def _check(core: Any, dc: Any, mem: _Memory, codec: str, n: int, rng) -> int:
    """Wrong bytes of one codec at n values: payload, residual, decode_add."""
    x = _values(n, rng)
    res = (rng.standard_normal(n) * 1e-3).astype(np.float32)
    size = core.codec_payload_bytes(codec, n)
    cpu, cpu_res = np.zeros(size, np.uint8), res.copy()
    core.codec_encode(codec, x, KEY, cpu, cpu_res)
    dx, dres = mem.put(x), mem.put(res)
    got = np.zeros(size, np.uint8)
    dc.begin(0)
    dc.encode(codec, dx, n, KEY, got, dres)
    wrong = int(np.count_nonzero(got != cpu))
    wrong += int(
        np.count_nonzero(mem.get(dres, np.float32, n).view(np.uint32) != cpu_res.view(np.uint32))
    )
    acc = rng.standard_normal(n).astype(np.float32)
    dacc = mem.put(acc)
    payloads = [cpu, got, cpu]
    dc.decode_add(codec, payloads, n, dacc)
    core.codec_decode_add(codec, payloads, n, acc)
    wrong += int(
        np.count_nonzero(mem.get(dacc, np.float32, n).view(np.uint32) != acc.view(np.uint32))
    )
    return wrong


def _timed(core: Any, dc: Any, mem: _Memory, codec: str, n: int, reps: int) -> Tuple[float, float]:
    """(encode GB/s, decode_add GB/s) of float32 values, medians of ``reps`` calls."""
    dx = mem.put(np.random.default_rng(1).standard_normal(n).astype(np.float32))
    dacc = mem.empty(4 * n)
    payload = np.zeros(core.codec_payload_bytes(codec, n), np.uint8)
    payloads = [payload] * 3

    def median(fn) -> float:
        fn()  # warm-up: loads the kernel, grows the scratch
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    dc.begin(0)
    encode = median(lambda: dc.encode(codec, dx, n, KEY, payload))
    add = median(lambda: dc.decode_add(codec, payloads, n, dacc))
    return 4 * n / encode / 1e9, 3 * 4 * n / add / 1e9


def run(
    device: int,
    seed: int,
    n_check: int = (1 << 20) + 3,
    n_time: int = 64 << 20,
    reps: int = 5,
    fake: bool = False,
) -> int:
    """Prints the table; returns the number of wrong bytes."""
    from ringreduce import _core

    rng = np.random.default_rng(seed)
    dc = _core.DeviceCodec(device, fake, 60.0)
    mem = _Memory(device, fake)
    wrong_total = 0
    print(
        f"\ncodec kernels: wrong bytes of {n_check} values (payload, residual, decode_add "
        f"of 3), and GB/s of float32 values at {n_time} values, median of {reps}"
    )
    print(f"{'codec':<8}{'wrong':>7}{'encode GB/s':>14}{'decode_add GB/s':>17}")
    try:
        for codec in CODECS:
            wrong = _check(_core, dc, mem, codec, n_check, rng)
            encode, add = _timed(_core, dc, mem, codec, n_time, reps)
            mem.close()
            wrong_total += wrong
            print(f"{codec:<8}{wrong:>7}{encode:>14.1f}{add:>17.1f}")
    finally:
        mem.close()
    print("(encode includes copying the payload to the host; decode_add copies 3 payloads in)")
    return wrong_total


if __name__ == "__main__":  # the CPU emulation: checks this script without a GPU
    import sys

    sys.exit(1 if run(0, 1, n_time=1 << 20, reps=2, fake=True) else 0)
