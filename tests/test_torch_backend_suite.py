"""A subset of PyTorch's own distributed test suite (DistributedTest, from the torch
wheel) on the ringreduce backend, at 2 ranks: every collective torch calls, point to
point, DDP with hooks, no_sync and join, subgroups and futures.

The whole suite, on ringreduce and on Gloo side by side, is
``python tests/torch_suite/compare.py --world-size 2`` (about an hour on 2 cores).
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

pytest.importorskip("torch")
pytest.importorskip("expecttest")  # what importing the suite needs
pytest.importorskip("hypothesis")

HERE = os.path.dirname(os.path.abspath(__file__))

SUBSET = [
    "test_all_reduce_sum",
    "test_all_reduce_sum_async",
    "test_all_reduce_sum_complex",
    "test_all_reduce_full_group_max",
    "test_all_reduce_coalesced_sum",
    "test_broadcast",
    "test_reduce_sum",
    "test_reduce_group_min",
    "test_all_gather",
    "test_all_gather_coalesced_simple",
    "test_gather",
    "test_scatter",
    "test_all_to_all",
    "test_all_to_all_single_unequal_split",
    "test_send_recv_any_source",
    "test_send_recv_with_tag",
    "test_isend",
    "test_barrier",
    "test_new_subgroups",
    "test_get_future",
    "test_DistributedDataParallel",
    "test_accumulate_gradients_no_sync_allreduce_with_then_hook",
    "test_ddp_uneven_inputs",
    "test_DistributedSampler_padding",
]


@pytest.mark.timeout(1600)
def test_pytorch_distributed_suite_subset(tmp_path):
    junit = tmp_path / "suite.xml"
    ids = [f"{HERE}/torch_suite/dist_suite.py::TestDistBackendWithSpawn::{t}" for t in SUBSET]
    env = dict(os.environ, BACKEND="ringreduce", WORLD_SIZE="2")
    cmd = [
        sys.executable, "-m", "pytest", *ids, "-q", "-o", "addopts=", "-o",
        "filterwarnings=default", "-p", "no:cacheprovider", f"--junitxml={junit}",
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1500)
    outcome = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        bad = case.find("failure") is not None or case.find("error") is not None
        outcome[case.get("name")] = (
            "failed" if bad else "skipped" if case.find("skipped") is not None else "passed"
        )
    # Every test of the subset ran (none skipped: they all run on Gloo) and passed.
    assert outcome == {t: "passed" for t in SUBSET}, proc.stdout[-6000:]
