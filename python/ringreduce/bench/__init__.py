"""``ringreduce bench``: all_reduce bandwidth sweep in the style of nccl-tests.

``ringreduce bench -n 4`` launches 4 local ranks (through ``ringreduce.launch``) and rank 0
prints one row per message size: the mean per-iteration time (the maximum over ranks),
algorithm bandwidth ``algbw = size / time`` and bus bandwidth
``busbw = algbw * 2(N-1)/N`` (GB = 1e9 bytes), for out-of-place and in-place calls, each
with ``#wrong``, the number of result elements (summed over ranks) that differ from the
exact expected value. Under ``mpirun`` or ``ringreduce launch`` it runs directly.

``--compare mpi,gloo`` times ``MPI_Allreduce`` (mpi4py; under mpirun only) and
torch.distributed's Gloo backend on the same buffers and sizes, in the same process, one
right after the other, and prints their time and busbw with the ratio ours/theirs.
"""

from .data import (
    bus_factor,
    count_wrong,
    default_iters,
    default_warmup,
    expected_output,
    make_input,
    parse_size,
    resolve_dtype,
    sweep_sizes,
)
from .sweep import main

__all__ = [
    "bus_factor",
    "count_wrong",
    "default_iters",
    "default_warmup",
    "expected_output",
    "main",
    "make_input",
    "parse_size",
    "resolve_dtype",
    "sweep_sizes",
]
