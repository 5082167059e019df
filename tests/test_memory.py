"""Peak memory of the collectives: none needs more than its output plus a few segments.

Each rank allocates its arrays, resets the kernel's record of its peak resident set
(/proc/self/clear_refs, Linux), runs one large collective and reads the peak back
(VmHWM). The rise over the resident set before the call is what the call itself
needed: with ``out`` given, only scratch (a few 1 MiB segments); without, the output
on top. A temporary the size of the input (which reduce_scatter used to allocate)
is several times the bound.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from _ranks import run_ranks

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc/self/status: runs on Linux"
)

MIB = 1 << 20
SIZE = 128 * MIB  # bytes of each rank's input
# Scratch a call may use besides its output: segments of the transport's views and of
# reduce_scatter's partial sums (1 MiB each by default), and the allocator's slack.
SCRATCH_BOUND = 24 * MIB


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def _peak_rise(call) -> int:
    """Bytes by which the peak resident set rose above the current one during call()."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak (VmHWM) becomes the current resident set
    before = _status("VmRSS")
    result = call()
    rise = _status("VmHWM") - before
    del result
    return rise


def _measure(comm, collective: str, preallocate: bool):
    import ringreduce as rr

    n = comm.world_size
    count = SIZE // 4
    start, stop = rr.chunk_bounds(count, n, comm.rank)
    shapes = {
        "all_reduce": (count,),
        "all_reduce in place": (count,),
        "reduce_scatter": (stop - start,),
        "all_gather": (n, count // n),
        "broadcast": (count,),
    }
    # all_gather's output is n inputs: its input is 1/n of the others'.
    x = np.ones(count // n if collective == "all_gather" else count, dtype=np.float32)
    out = np.ones(shapes[collective], dtype=np.float32) if preallocate else None
    calls = {
        "all_reduce": lambda: comm.all_reduce(x, out=out),
        "all_reduce in place": lambda: comm.all_reduce(x, out=x),
        "reduce_scatter": lambda: comm.reduce_scatter(x, out=out),
        "all_gather": lambda: comm.all_gather(x, out=out),
        "broadcast": lambda: comm.broadcast(x, root=0),
    }
    comm.barrier()
    rise = _peak_rise(calls[collective])
    writes_into_x = collective in ("all_reduce in place", "broadcast")
    output = 0 if preallocate or writes_into_x else int(np.prod(shapes[collective])) * 4
    return rise, output


@pytest.mark.slow
@pytest.mark.skipif(
    not os.path.exists("/proc/self/clear_refs"), reason="needs /proc/self/clear_refs (Linux)"
)
@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize(
    "collective",
    ["all_reduce", "all_reduce in place", "reduce_scatter", "all_gather", "broadcast"],
)
@pytest.mark.parametrize("preallocate", [True, False], ids=["out given", "out=None"])
def test_peak_memory_is_output_plus_a_few_segments(n, collective, preallocate):
    outcomes = run_ranks(n, _measure, collective, preallocate, init_timeout=120)
    for status, value, tb in outcomes:
        assert status == "ok", tb
        rise, output = value
        assert rise <= output + SCRATCH_BOUND, (
            f"{collective} at {n} ranks raised the peak by {rise / MIB:.1f} MiB "
            f"(output {output / MIB:.1f} MiB, scratch bound {SCRATCH_BOUND / MIB:.0f} MiB)"
        )
