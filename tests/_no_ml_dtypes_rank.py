"""One rank of test_without_ml_dtypes: ringreduce with ml_dtypes unimportable.

Imports ringreduce (which must not import ml_dtypes), runs an exact float32 all_reduce
and compressed ones on float32 data, then asks for bfloat16 and prints the error.
Prints one JSON line of what it saw.
"""

from __future__ import annotations

import json
import sys

import numpy as np

import ringreduce as rr

seen = {"ml_dtypes_at_import": "ml_dtypes" in sys.modules}
with rr.init() as comm:
    n, r = comm.world_size, comm.rank
    counts = np.arange(1000, dtype=np.float32) + r
    whole = n * np.arange(1000, dtype=np.float32) + n * (n - 1) / 2
    seen["exact"] = bool(np.array_equal(comm.all_reduce(counts), whole))
    # Values no codec carries exactly: each one's error is then above 0.
    inputs = [np.sin(np.arange(1000) * 0.37 + k).astype(np.float32) for k in range(n)]
    expected = np.sum(inputs, axis=0, dtype=np.float64)
    for codec in ("int8", "fp16", "bf16"):
        y = comm.all_reduce(inputs[r], compression=codec)
        seen[codec] = float(np.max(np.abs(y - expected)) / np.max(np.abs(expected)))
    seen["wire_codecs"] = sorted(comm.stats().get("wire_bytes", {}))
    f16 = np.full(64, r + 1, dtype=np.float16)
    seen["float16"] = bool(np.all(comm.all_reduce(f16) == n * (n + 1) / 2))
    try:
        rr.GradientBucketer(comm).register("w", (4,), "bfloat16")
        seen["bfloat16"] = "no error"
    except ImportError as exc:
        seen["bfloat16"] = str(exc)
    seen["ml_dtypes_at_end"] = "ml_dtypes" in sys.modules
print(json.dumps(seen), flush=True)
