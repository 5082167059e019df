"""Check-then-time harness for the CUDA reduction kernels, for a machine with a GPU.

    bash bench/gpu_check.sh            # builds with CUDA, then runs this
    python bench/gpu_check.py [--seed S] [--count N] [--gib G] [--device D]

1. Correctness: every dtype x op on fresh random data (the seed is printed, so
   a failure can be replayed with --seed), out of place into 16-byte aligned
   buffers (vector path), all three one element off alignment (single-element
   head, then vector path), at different offsets (single elements throughout),
   and in place (out is a). Outputs start poisoned and carry poisoned guards on
   both sides. A result is wrong when its bits differ from the numpy reference
   (any NaN matches any NaN; for min/max +0 matches -0, whose sign IEEE leaves
   open). The reference computes in float64, which after rounding is exactly
   the float32 and float64 result; 16-bit floats are computed in float32, the
   engine's documented compute type; integers wrap around as in numpy.
2. Bandwidth: the float32 sum kernel on 1 GiB operands (out = a + b, counted as
   two reads and one write) against a device-to-device cudaMemcpyAsync of 1 GiB
   (one read, one write), both timed with CUDA events on one stream, in the same
   run. Target: the kernel at >= 90% of the copy's bandwidth.
3. Collectives: a 2-rank all_reduce over TCP with both ranks on this GPU, of
   torch.cuda tensors (ringreduce's own device arrays without torch), every
   dtype x op on fresh random data against the same reference, and a timed
   float32 all_reduce (bench/_gpu_ring_check.py).
4. Codec kernels: each compression codec's encode (with a residual) and decode_add on
   the GPU against the CPU loops, bit for bit, then their speed on 256 MiB
   (bench/_gpu_codec_check.py).

Device memory comes from the extension itself (no torch or cupy needed).
Exit status: 0 when every result is right, 1 when any is wrong, 2 when there is
no usable GPU or no CUDA build. Ran in 31 s on an H200.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Callable, Dict, List, Tuple

import numpy as np

DTYPES = ["float16", "bfloat16", "float32", "float64", "int8", "uint8", "int32", "int64"]
OPS = ["sum", "prod", "min", "max", "avg"]
# Filled from ringreduce._core in main(), which imports it only after the checks.
DTYPE_CODES: Dict[str, int] = {}
OP_CODES: Dict[str, int] = {}
POISON = 0xA5
# Input guards hold other bytes, so that an overrun cannot copy poison into poison.
INPUT_GUARD = 0x5A
GUARD = 256
TARGET = 0.90


# ---- dtypes: storage in numpy, conversion to and from the compute type -----
# bfloat16 is kept as uint16 bit patterns so that ml_dtypes is not needed.


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """Round to nearest, ties to even; NaN stays NaN (quieted)."""
    u = x.astype(np.float32).view(np.uint32)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, ((u >> 16) | 0x40).astype(np.uint16), rounded)


Codec = Tuple[np.dtype, np.dtype, Callable[[np.ndarray], np.ndarray], Callable]


def codec(dtype: str) -> Codec:
    """(storage dtype, compute dtype, to_compute, from_compute)."""
    if dtype == "bfloat16":
        return np.dtype(np.uint16), np.dtype(np.float32), bf16_to_f32, f32_to_bf16
    store = np.dtype(dtype)
    compute = {"float16": np.float32, "float32": np.float64}.get(dtype, store)
    return store, np.dtype(compute), lambda x: x.astype(compute), lambda x: x.astype(store)


def random_data(dtype: str, count: int, rng: np.random.Generator) -> np.ndarray:
    store, _, _, from_compute = codec(dtype)
    if dtype in ("int8", "uint8", "int32", "int64"):
        info = np.iinfo(store)
        return rng.integers(info.min, info.max, size=count, endpoint=True, dtype=store)
    limit = {"float16": 6e4, "bfloat16": 3e38, "float32": 3e38, "float64": 1e308}[dtype]
    scale = rng.choice([1.0, 1e3, limit, 1e-6], size=count)
    with np.errstate(all="ignore"):
        x = rng.standard_normal(count) * scale
        special = rng.random(count) < 0.01
        x[special] = rng.choice([0.0, -0.0, np.inf, -np.inf, np.nan], size=int(special.sum()))
        return from_compute(x.astype(np.float32) if dtype == "bfloat16" else x)


def reference(dtype: str, op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    _, _, to_compute, from_compute = codec(dtype)
    x, y = to_compute(a), to_compute(b)
    fn = {"sum": np.add, "avg": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}
    with np.errstate(all="ignore"):
        return from_compute(fn[op](x, y))


def count_wrong(dtype: str, op: str, got: np.ndarray, want: np.ndarray) -> int:
    bits = np.dtype(f"u{got.itemsize}")
    differ = got.view(bits) != want.view(bits)
    if dtype in ("float16", "bfloat16", "float32", "float64"):
        to_compute = codec(dtype)[2]
        g, w = to_compute(got).astype(np.float64), to_compute(want).astype(np.float64)
        differ &= ~(np.isnan(g) & np.isnan(w))
        if op in ("min", "max"):
            differ &= ~((g == 0) & (w == 0))
    return int(differ.sum())


# ---- device side -------------------------------------------------------------


class Device:
    """Raw allocations and kernel calls through the CUDA hooks of ringreduce._core.testing."""

    def __init__(self, core, device: int) -> None:
        self.core = core
        self.device = device
        self.live: List[int] = []

    def alloc(self, nbytes: int) -> int:
        ptr = int(self.core.testing.cuda_malloc(nbytes, self.device))
        self.live.append(ptr)
        return ptr

    def put(self, ptr: int, host: np.ndarray) -> None:
        host = np.ascontiguousarray(host)
        self.core.testing.cuda_memcpy(ptr, host.ctypes.data, host.nbytes)

    def get(self, ptr: int, dtype: np.dtype, count: int) -> np.ndarray:
        out = np.empty(count, dtype=dtype)
        self.core.testing.cuda_memcpy(out.ctypes.data, ptr, out.nbytes)
        return out

    def free_all(self) -> None:
        while self.live:
            self.core.testing.cuda_free(self.live.pop())


# Element offsets of (out, a, b) past a boundary: packs throughout; a head of
# single elements, then packs; single elements throughout. None: out is a.
LAYOUTS = {
    "aligned": (0, 0, 0),
    "same offset": (1, 1, 1),
    "mixed offsets": (0, 1, 2),
    "in place": None,
}


def check_one(dev: Device, dtype: str, op: str, count: int, rng: np.random.Generator) -> int:
    """Wrong elements, plus overwritten guard bytes, over all LAYOUTS."""
    store = codec(dtype)[0]
    size = store.itemsize
    a, b = random_data(dtype, count, rng), random_data(dtype, count, rng)
    want = reference(dtype, op, a, b)
    code = (DTYPE_CODES[dtype], OP_CODES[op])
    nbytes = GUARD + (count + 2) * size + GUARD
    wrong = 0
    try:
        for shifts in LAYOUTS.values():
            in_place = shifts is None
            offs = [GUARD + s * size for s in (shifts or (0, 0, 0))]
            bases = [dev.alloc(nbytes) for _ in range(3)]
            for ptr, fill in zip(bases, (POISON, INPUT_GUARD, INPUT_GUARD)):
                dev.put(ptr, np.full(nbytes, fill, dtype=np.uint8))
            out, pa, pb = (ptr + off for ptr, off in zip(bases, offs))
            dev.put(pa, a)
            dev.put(pb, b)
            if in_place:
                out, bases[0] = pa, bases[1]
            dev.core.testing.cuda_reduce(*code, out, pa, pb, count)
            raw = dev.get(bases[0], np.uint8, nbytes)
            start = out - bases[0]
            body = raw[start : start + count * size]
            guards = np.concatenate([raw[:start], raw[start + count * size :]])
            wrong += int((guards != (INPUT_GUARD if in_place else POISON)).sum())
            wrong += count_wrong(dtype, op, body.view(store), want)
            dev.free_all()
    finally:
        dev.free_all()
    return wrong


def bandwidth(dev: Device, gib: float, iters: int, trials: int) -> Dict[str, Tuple[float, float]]:
    """(GB/s, seconds per call) of the copy, the reduce and the in-place reduce.

    GB = 1e9 bytes. The reduce result is checked before it is timed.
    """
    n = int(gib * (1 << 30)) // 4
    nbytes = n * 4
    pa, pb, out = dev.alloc(nbytes), dev.alloc(nbytes), dev.alloc(nbytes)
    dev.put(pa, np.full(n, 1.0, dtype=np.float32))
    dev.put(pb, np.full(n, 2.0, dtype=np.float32))
    core, f32_sum = dev.core, (DTYPE_CODES["float32"], OP_CODES["sum"])
    core.testing.cuda_reduce(*f32_sum, out, pa, pb, n)
    if not (dev.get(out, np.float32, n) == 3.0).all():
        raise SystemExit("FAIL: the 1 GiB float32 sum is wrong; not timing it")

    def median_seconds(fn: Callable[[], float]) -> float:
        return statistics.median(fn() for _ in range(trials))

    copy = median_seconds(lambda: core.testing.cuda_time_copy(out, pa, nbytes, iters))
    reduce = median_seconds(lambda: core.testing.cuda_time_reduce(*f32_sum, out, pa, pb, n, iters))
    # In place doubles pb's contents each call; the values do not matter here.
    in_place = median_seconds(lambda: core.testing.cuda_time_reduce(*f32_sum, pb, pb, pa, n, iters))
    dev.free_all()
    return {
        "d2d copy (1 read + 1 write)": (2 * nbytes / copy / 1e9, copy),
        "reduce out=a+b (2 reads + 1 write)": (3 * nbytes / reduce / 1e9, reduce),
        "reduce a+=b in place (2R + 1W)": (3 * nbytes / in_place / 1e9, in_place),
    }


def main(argv: List[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=None, help="replay a run (default: fresh)")
    parser.add_argument("--count", type=int, default=(1 << 22) + 3, help="elements per check")
    parser.add_argument("--gib", type=float, default=1.0, help="operand size for timing")
    parser.add_argument("--iters", type=int, default=20, help="kernel calls per timing trial")
    parser.add_argument("--trials", type=int, default=5, help="timing trials (median kept)")
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument(
        "--ring-count", type=int, default=(1 << 20) + 7, help="elements per 2-rank all_reduce check"
    )
    args = parser.parse_args(argv)

    try:
        import ringreduce as rr
        from ringreduce import _core
    except ImportError as exc:
        print(f"ringreduce is not importable ({exc}); run bench/gpu_check.sh", file=sys.stderr)
        return 2
    if not rr.build_info().get("cuda"):
        print("ringreduce was built without CUDA: rebuild with nvcc present", file=sys.stderr)
        print("(bench/gpu_check.sh builds with -DRINGREDUCE_WITH_CUDA=ON)", file=sys.stderr)
        return 2
    if _core.cuda_device_count() <= args.device:
        print(f"no usable CUDA device {args.device} (no GPU, no driver, or", file=sys.stderr)
        print("CUDA_VISIBLE_DEVICES hides it): this check needs a GPU", file=sys.stderr)
        return 2

    seed = args.seed if args.seed is not None else int(np.random.SeedSequence().entropy % 2**32)
    rng = np.random.default_rng(seed)
    props = _core.cuda_device_properties(args.device)
    cc = "{}.{}".format(*props["compute_capability"])
    print(
        f"ringreduce {rr.__version__} gpu_check on {props['name']} (sm {cc}, "
        f"{props['multiprocessors']} SMs, {props['total_memory'] / 2**30:.0f} GiB), seed {seed}"
    )

    started = time.time()
    # The engine's own numbering of dtypes and ops, from the extension.
    DTYPE_CODES.update({name: int(code) for name, code in _core.DType.__members__.items()})
    OP_CODES.update({name.lower(): int(code) for name, code in _core.Op.__members__.items()})
    dev = Device(_core, args.device)
    table = {d: {op: check_one(dev, d, op, args.count, rng) for op in OPS} for d in DTYPES}
    total_wrong = sum(sum(row.values()) for row in table.values())
    print(f"\n#wrong of {args.count} elements in each layout: {', '.join(LAYOUTS)}")
    print(f"{'dtype':<10}" + "".join(f"{op:>7}" for op in OPS))
    for d in DTYPES:
        print(f"{d:<10}" + "".join(f"{table[d][op]:>7}" for op in OPS))

    rates = bandwidth(dev, args.gib, args.iters, args.trials)
    copy_rate = next(iter(rates.values()))[0]
    print(f"\nfloat32, {args.gib:g} GiB operands, median of {args.trials} x {args.iters} calls")
    print(f"{'':<36}{'time(us)':>10}{'GB/s':>9}{'of copy':>9}")
    for name, (rate, seconds) in rates.items():
        print(f"{name:<36}{seconds * 1e6:>10.1f}{rate:>9.0f}{rate / copy_rate:>9.1%}")
    kernel = list(rates.values())[1][0] / copy_rate
    verdict = "meets" if kernel >= TARGET else "BELOW"
    print(f"\nreduce kernel at {kernel:.1%} of copy bandwidth: {verdict} the {TARGET:.0%} target")

    import _gpu_ring_check

    ring_wrong = _gpu_ring_check.run(args.device, seed, args.ring_count)
    total_wrong += ring_wrong if ring_wrong >= 0 else 1

    import _gpu_codec_check

    total_wrong += _gpu_codec_check.run(args.device, seed)
    print(
        f"correctness: {'PASS' if total_wrong == 0 else 'FAIL'} ({total_wrong} wrong); "
        f"{time.time() - started:.0f} s"
    )
    return 0 if total_wrong == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
