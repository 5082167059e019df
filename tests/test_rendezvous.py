"""Rendezvous: rank/size from each launcher's environment, and the file store."""

from __future__ import annotations

import numpy as np
import pytest

from ringreduce import _env

from _ranks import run_ranks

LAUNCHER_ENVS = [
    {"RANK": "2", "WORLD_SIZE": "4"},
    {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4"},
    {"PMI_RANK": "2", "PMI_SIZE": "4"},
    {"SLURM_PROCID": "2", "SLURM_NTASKS": "4"},
]
ALL_VARS = {k for env in LAUNCHER_ENVS for k in env} | {"PMIX_RANK", "PMIX_SIZE"}


@pytest.mark.parametrize("env", LAUNCHER_ENVS, ids=lambda e: next(iter(e)))
def test_rank_and_size_from_each_launcher(monkeypatch, env):
    for var in ALL_VARS:
        monkeypatch.delenv(var, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert _env.rank_and_size(None, None) == (2, 4)
    assert _env.rank_and_size(1, None) == (1, 4)  # explicit arguments win


def test_no_environment_means_a_world_of_one(monkeypatch):
    for var in ALL_VARS:
        monkeypatch.delenv(var, raising=False)
    assert _env.rank_and_size(None, None) == (0, 1)
    with pytest.raises(ValueError, match="rank and world_size"):
        _env.rank_and_size(3, None)


@pytest.mark.parametrize("present", ["RANK", "WORLD_SIZE"])
def test_half_of_rank_and_world_size_is_an_error(monkeypatch, present):
    for var in ALL_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(present, "1")
    missing = "WORLD_SIZE" if present == "RANK" else "RANK"
    with pytest.raises(ValueError, match=f"{present}=1 is set but {missing} is not"):
        _env.rank_and_size(None, None)
    assert _env.rank_and_size(0, 2) == (0, 2)  # both given: the environment is not read


def test_master_address_defaults_and_validation(monkeypatch):
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("RINGREDUCE_PORT", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert _env.master_address(None, None) == ("127.0.0.1", 29500)
    monkeypatch.setenv("MASTER_PORT", "12345")
    assert _env.master_address(None, None) == ("127.0.0.1", 12345)
    # Under torchrun its agent's store holds MASTER_PORT: ours is the next one.
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    assert _env.master_address(None, None) == ("127.0.0.1", 12346)
    monkeypatch.setenv("RINGREDUCE_PORT", "23456")
    assert _env.master_address(None, None) == ("127.0.0.1", 23456)
    assert _env.master_address("h", 7) == ("h", 7)
    with pytest.raises(ValueError, match="master_port"):
        _env.master_address("h", 70000)


def _sum_ranks(comm):
    return int(comm.all_reduce(np.array([comm.rank], dtype=np.int64))[0])


@pytest.mark.parametrize("n", [2, 3])
def test_file_store_rendezvous(tmp_path, n):
    outcomes = run_ranks(n, _sum_ranks, store_dir=str(tmp_path / "store"), timeout=30)
    assert [o[1] for o in outcomes] == [sum(range(n))] * n, [o[2] for o in outcomes]
