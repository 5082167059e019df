"""PyTorch's own distributed test suite (``DistributedTest`` from the torch wheel), driven
as PyTorch's test/distributed/test_distributed_spawn.py drives it, for any backend:

    BACKEND=ringreduce WORLD_SIZE=2 python -m pytest tests/torch_suite/dist_suite.py
    BACKEND=gloo WORLD_SIZE=3 python -m pytest tests/torch_suite/dist_suite.py

Every test spawns WORLD_SIZE processes that call ``init_process_group(BACKEND, file://)``.
``tests/torch_suite/compare.py`` runs it for ringreduce and Gloo and compares the outcomes;
``tests/test_torch_backend_suite.py`` runs a subset in CI.
"""

from __future__ import annotations

import os
import sys

if "BACKEND" not in os.environ or "WORLD_SIZE" not in os.environ:
    raise RuntimeError("set BACKEND (ringreduce or gloo) and WORLD_SIZE")
os.environ.setdefault("TEMP_DIR", "")

import torch.distributed as dist  # noqa: E402
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

if os.environ["BACKEND"] == "ringreduce":
    import ringreduce.torch  # noqa: F401, E402  (registers the backend, here and in every spawned rank)

    # What the suite gates on features: ringreduce runs DDP and subgroups, on CPU here.
    for feature in ("plugin", "ddp", "subgroup"):
        DistTestCases.backend_feature[feature].add("ringreduce")

# The suite decides from the name in BACKEND which tests a backend runs (most collective
# tests run only for "gloo", "nccl" or "mpi", when the module is imported) and, inside
# many tests, what to expect ("if BACKEND == 'gloo': ..."). So that ringreduce runs every
# test Gloo runs and is held to what Gloo is held to, the suite is imported and run as
# if for Gloo, and every init_process_group(backend="gloo") it makes becomes
# init_process_group(backend="ringreduce"): every process group of every test is ours.
# (What remains different: dist.get_backend() says "ringreduce".)
_backend = os.environ["BACKEND"]
if _backend == "ringreduce":
    os.environ["BACKEND"] = "gloo"
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)

os.environ["BACKEND"] = _backend  # what the spawned ranks see when they import this file
if _backend == "ringreduce":
    _init_process_group = dist.init_process_group

    def _init_ours(*args, backend=None, **kwargs):
        if backend == "gloo":
            backend = "ringreduce"
        return _init_process_group(*args, backend=backend, **kwargs)

    dist.init_process_group = _init_ours

if not dist.is_available():
    sys.exit(0)


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()
