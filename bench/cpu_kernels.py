"""Time of the CPU reduction kernels on one cache-sized block, per dtype and op: the
pairwise kernel chained over N inputs (the ring's and the direct path's reduction) against
reduce_all, which reads the N inputs in one pass (the window paths'). GB/s counts the
input bytes read (N x block) per second. Both run on the same buffers, best of a few
repeats of many calls, so the columns compare within a row.

    python bench/cpu_kernels.py                        # 64 KiB blocks, 2 and 4 inputs
    python bench/cpu_kernels.py --kib 1024 --inputs 2,3,8 --dtypes bfloat16,float16
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import ringreduce as rr
from ringreduce import _core
from ringreduce._arrays.bfloat16 import bfloat16

DTYPES = ("float32", "float64", "bfloat16", "float16", "int32", "int8")
OPS = ("sum", "max")


def codes() -> tuple[dict, dict]:
    dtypes = {name.lower(): int(code) for name, code in _core.DType.__members__.items()}
    ops = {name.lower(): int(code) for name, code in _core.Op.__members__.items()}
    return dtypes, ops


def seconds_per_call(fn, calls: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best


def row(dtype: str, op: str, inputs: int, block: int, calls: int, repeat: int) -> str:
    dtype_codes, op_codes = codes()
    dt = bfloat16() if dtype == "bfloat16" else np.dtype(dtype)
    n = block // dt.itemsize
    rng = np.random.default_rng(0)
    bufs = [rng.standard_normal(n).astype(np.float32).astype(dt) for _ in range(inputs)]
    out = np.empty(n, dt)
    d, o = dtype_codes[dtype], op_codes[op]
    addrs = [b.ctypes.data for b in bufs]
    p = out.ctypes.data

    def pairwise() -> None:
        _core.testing.reduce_local(d, o, p, addrs[0], addrs[1], n)
        for a in addrs[2:]:
            _core.testing.reduce_local(d, o, p, p, a, n)

    def one_pass() -> None:
        _core.testing.reduce_all_local(d, o, addrs, p, n, 0)

    t_pair = seconds_per_call(pairwise, calls, repeat)
    t_all = seconds_per_call(one_pass, calls, repeat)
    read = inputs * n * dt.itemsize
    return (
        f"{dtype:>9} {op:>4} {inputs:>6} {t_pair * 1e6:>12.2f} {t_all * 1e6:>13.2f} "
        f"{read / t_pair / 1e9:>13.1f} {read / t_all / 1e9:>14.1f} {t_all / t_pair:>6.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kib", type=int, default=64, help="block size in KiB (default 64)")
    parser.add_argument("--inputs", default="2,4", help="numbers of inputs (default 2,4)")
    parser.add_argument("--dtypes", default=",".join(DTYPES))
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument("--calls", type=int, default=0, help="calls per repeat (default: ~20 ms)")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    block = args.kib << 10
    calls = args.calls or max(10, (20 << 20) // max(block, 1))
    isa = rr.build_info()["cpu_kernels"]
    print(f"# CPU kernels: {isa}; {args.kib} KiB per input, best of {args.repeat} x {calls} calls")
    print(
        f"{'dtype':>9} {'op':>4} {'inputs':>6} {'pairwise us':>12} {'reduce_all us':>13} "
        f"{'pairwise GB/s':>13} {'reduce_all GB/s':>14} {'ratio':>6}"
    )
    for dtype in args.dtypes.split(","):
        for op in args.ops.split(","):
            for inputs in (int(k) for k in args.inputs.split(",")):
                print(row(dtype, op, inputs, block, calls, args.repeat), flush=True)


if __name__ == "__main__":
    main()
