"""GB/s of each codec's encode, decode and decode-sum, numpy reference against the C++
kernels: check, then time. GB/s counts float32 input bytes (n * 4) per second, so the
numbers compare with the link's bandwidth of fp32 data; decode-sum adds 3 payloads into
one float32 accumulator (the owner's sum at 4 ranks) and counts 3 * n * 4 bytes.

    python bench/codec_speed.py            # 64 MB, best of 3, every kernel variant
    python bench/codec_speed.py --mb 8 --repeat 5 --isa avx2
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from ringreduce import _core
from ringreduce.compression import get_codec

CODECS = ("bf16", "fp16", "int8", "int4")
PEERS = 3


def best(repeat: int, fn, *args, **kwargs) -> float:
    """The shortest of ``repeat`` timed calls of fn(*args, **kwargs), in seconds."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(*args, **kwargs)
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=64, help="MB of float32 input (default 64)")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs; the best is kept")
    ap.add_argument("--codecs", default=",".join(CODECS))
    ap.add_argument(
        "--isa",
        default=",".join(_core.codec_kernel_isas()),
        help="the kernels' instruction sets to time, side by side (default: every one this "
        f"machine runs: {','.join(_core.codec_kernel_isas())}; the first is what the engine uses)",
    )
    args = ap.parse_args()
    n = int(args.mb * (1 << 20)) // 4
    x = np.random.default_rng(0).standard_normal(n, dtype=np.float32)
    r0 = np.random.default_rng(1).standard_normal(n, dtype=np.float32) * np.float32(1e-3)
    gb = x.nbytes / 1e9
    isas = args.isa.split(",")
    print(
        f"{n} float32 values ({x.nbytes / 2**20:.0f} MiB), best of {args.repeat}; GB/s of "
        "float32 input; enc+EF: encode with error feedback (x + residual in, residual out)"
    )
    print(
        f"{'codec':6s} {'path':8s} {'encode':>8s} {'enc+EF':>8s} {'decode':>8s} "
        f"{'dec-sum':>8s}  check"
    )
    engine_isa = _core.codec_kernel_isa()
    try:
        for name in args.codecs.split(","):
            codec = get_codec(name)
            payload = codec.encode(x, 1, use_numpy=True)  # the reference bytes
            peers = [codec.encode(x, 2 + k) for k in range(PEERS)]
            for path in ("numpy", *isas):
                numpy = path == "numpy"
                if not numpy:
                    _core.use_codec_kernel_isa(path)
                # Check first: the path's bytes are the reference's.
                same = codec.encode(x, 1, use_numpy=numpy).tobytes() == payload.tobytes()
                acc = np.zeros(n, np.float32)
                r = args.repeat
                enc = best(r, codec.encode, x, 1, use_numpy=numpy)
                ef = best(
                    r, lambda c=codec, u=numpy: c.encode_feedback(x, r0.copy(), 1, use_numpy=u)
                )
                ef -= best(r, r0.copy)  # the copy that keeps every run's residual the same
                dec = best(r, codec.decode, payload, n, use_numpy=numpy)
                dsum = best(r, codec.decode_add, peers, n, acc, use_numpy=numpy)
                print(
                    f"{name:6s} {path:8s} {gb / enc:8.2f} {gb / ef:8.2f} {gb / dec:8.2f} "
                    f"{PEERS * gb / dsum:8.2f}  {'same bytes' if same else 'WRONG'}"
                )
    finally:
        _core.use_codec_kernel_isa(engine_isa)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
