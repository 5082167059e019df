"""Partial or inconsistent launcher environments fail at init() with a ValueError that
names the variables, instead of running as a world of one or waiting for ranks that
never come."""

from __future__ import annotations

import pytest

import ringreduce as rr
from ringreduce import _env

# Every variable _env reads to find rank, world size and rank 0's address.
VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "PMI_RANK",
    "PMI_SIZE",
    "MPI_LOCALNRANKS",
    "PMIX_RANK",
    "PMIX_SIZE",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "MASTER_ADDR",
    "MASTER_PORT",
    "RINGREDUCE_PORT",
    "TORCHELASTIC_RUN_ID",
    "RINGREDUCE_TRANSPORT",
)


@pytest.fixture
def env(monkeypatch):
    """A clean launcher environment; returns a function that sets variables."""
    for var in VARS:
        monkeypatch.delenv(var, raising=False)

    def set_vars(**values: str) -> None:
        for k, v in values.items():
            monkeypatch.setenv(k, v)

    return set_vars


@pytest.mark.parametrize(
    "values, named",
    [
        ({"WORLD_SIZE": "2"}, ["WORLD_SIZE=2", "RANK is not"]),  # the case
        ({"RANK": "1"}, ["RANK=1", "WORLD_SIZE is not"]),
        ({"RANK": "one", "WORLD_SIZE": "2"}, ["RANK", "'one'"]),
        ({"RANK": "0", "WORLD_SIZE": "2.5"}, ["WORLD_SIZE", "'2.5'"]),
        ({"RANK": "2", "WORLD_SIZE": "2"}, ["RANK=2", "WORLD_SIZE=2", "[0, 2)"]),
        ({"RANK": "-1", "WORLD_SIZE": "2"}, ["RANK=-1", "WORLD_SIZE=2"]),
        ({"RANK": "0", "WORLD_SIZE": "0"}, ["WORLD_SIZE=0", ">= 1"]),
        ({"RANK": "0", "WORLD_SIZE": "-3"}, ["WORLD_SIZE=-3", ">= 1"]),
        ({"OMPI_COMM_WORLD_RANK": "4", "OMPI_COMM_WORLD_SIZE": "4"}, ["OMPI_COMM_WORLD_RANK=4"]),
        ({"SLURM_PROCID": "x", "SLURM_NTASKS": "4"}, ["SLURM_PROCID", "'x'"]),
        # WORLD_SIZE copied from another job, under mpirun.
        (
            {
                "RANK": "1",
                "WORLD_SIZE": "4",
                "OMPI_COMM_WORLD_RANK": "1",
                "OMPI_COMM_WORLD_SIZE": "2",
            },
            ["WORLD_SIZE=4", "OMPI_COMM_WORLD_SIZE=2", "unset RANK and WORLD_SIZE"],
        ),
        # One RANK exported to every process mpiexec starts.
        (
            {"RANK": "0", "WORLD_SIZE": "2", "PMI_RANK": "1", "PMI_SIZE": "2"},
            ["RANK=0", "PMI_RANK=1"],
        ),
    ],
)
def test_partial_or_inconsistent_environment_names_the_variables(env, values, named):
    env(**values)
    with pytest.raises(ValueError) as info:
        _env.rank_and_size(None, None)
    for text in named:
        assert text in str(info.value), str(info.value)
    # init() says the same before it opens a socket.
    with pytest.raises(ValueError) as info:
        rr.init("tcp", timeout=2)
    for text in named:
        assert text in str(info.value), str(info.value)


def test_explicit_arguments_are_checked_against_the_environment(env):
    env(RANK="1", WORLD_SIZE="3")
    assert _env.rank_and_size(2, None) == (2, 3)
    assert _env.rank_and_size(None, 4) == (1, 4)
    with pytest.raises(ValueError, match=r"rank=3 is not a rank of WORLD_SIZE=3"):
        _env.rank_and_size(3, None)
    with pytest.raises(ValueError, match=r"RANK=1 is not a rank of world_size=1"):
        _env.rank_and_size(None, 1)


def test_launchers_that_agree_or_nest_are_accepted(env):
    # mpirun's own variables, with RANK/WORLD_SIZE that say the same.
    env(RANK="1", WORLD_SIZE="2", OMPI_COMM_WORLD_RANK="1", OMPI_COMM_WORLD_SIZE="2")
    assert _env.rank_and_size(None, None) == (1, 2)
    # torchrun or ringreduce launch started by mpirun (one per host): their ranks count.
    env(RANK="5", WORLD_SIZE="8", LOCAL_WORLD_SIZE="4")
    assert _env.rank_and_size(None, None) == (5, 8)


def test_srun_variables_may_differ_from_a_batch_scripts_own_ranks(env):
    # A batch script of a 16-task allocation that starts 4 ranks itself inherits the
    # allocation's SLURM variables; they describe the allocation, not these ranks.
    env(RANK="3", WORLD_SIZE="4", SLURM_PROCID="0", SLURM_NTASKS="16")
    assert _env.rank_and_size(None, None) == (3, 4)


@pytest.mark.parametrize(
    "values",
    [
        {"LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "4", "RANK": "0"},
        {"OMPI_COMM_WORLD_LOCAL_SIZE": "1", "OMPI_COMM_WORLD_SIZE": "2"},
        {"MPI_LOCALNRANKS": "2", "PMI_SIZE": "6"},
    ],
)
def test_master_port_without_master_addr_on_several_hosts(env, monkeypatch, values):
    env(MASTER_PORT="29400", **values)
    with pytest.raises(ValueError) as info:
        _env.master_address(None, None)
    text = str(info.value)
    assert "MASTER_PORT=29400 is set but MASTER_ADDR is not" in text, text
    local_var = next(k for k in values if "LOCAL" in k)
    assert local_var in text, text
    # An address, from the caller or the environment, settles it.
    assert _env.master_address("10.0.0.1", None) == ("10.0.0.1", 29400)
    env(MASTER_ADDR="10.0.0.2")
    assert _env.master_address(None, None) == ("10.0.0.2", 29400)
    # Without MASTER_PORT either: loopback cannot reach rank 0 on another host.
    monkeypatch.delenv("MASTER_PORT")
    monkeypatch.delenv("MASTER_ADDR")
    with pytest.raises(ValueError, match="^MASTER_ADDR is not set, and the ranks are on"):
        _env.master_address(None, None)


def test_master_port_alone_on_one_host_means_loopback(env):
    env(MASTER_PORT="29400", LOCAL_WORLD_SIZE="4", WORLD_SIZE="4", RANK="0")
    assert _env.master_address(None, None) == ("127.0.0.1", 29400)


@pytest.mark.parametrize("var", ["MASTER_PORT", "RINGREDUCE_PORT"])
def test_a_port_that_is_not_a_number_names_its_variable(env, var):
    env(**{var: "http"})
    with pytest.raises(ValueError, match=f"{var} must be a port number, got 'http'"):
        _env.master_address(None, None)


# The RINGREDUCE_* settings engine_options reads, by Options field.
SETTINGS = {
    "segment_bytes": "RINGREDUCE_SEGMENT_BYTES",
    "small_bytes": "RINGREDUCE_SMALL_BYTES",
    "algorithm": "RINGREDUCE_ALGORITHM",
    "tcp_streams": "RINGREDUCE_TCP_STREAMS",
    "tcp_keepalive_seconds": "RINGREDUCE_TCP_KEEPALIVE",
    "spin_us": "RINGREDUCE_SPIN_US",
    "shm_single_copy_bytes": "RINGREDUCE_SHM_SINGLE_COPY_BYTES",
    "shm_slot_bytes": "RINGREDUCE_SHM_SLOT_BYTES",
    "device_staging_bytes": "RINGREDUCE_DEVICE_STAGING_BYTES",
    "device_land_in_place": "RINGREDUCE_DEVICE_IN_PLACE",
    "stream_store_bytes": "RINGREDUCE_STREAM_STORE_BYTES",
    "host_id": "RINGREDUCE_HOST_ID",
    "socket_addr": "RINGREDUCE_SOCKET_ADDR",
}


@pytest.fixture
def no_settings(monkeypatch):
    for var in (*SETTINGS.values(), "RINGREDUCE_DEBUG", "RINGREDUCE_TEST_FAKE_DEVICE"):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_unset_settings_keep_the_engines_defaults(no_settings):
    from ringreduce import _core

    defaults = _core.Options()
    options = _env.engine_options("tcp", 7.0)
    assert (options.transport, options.timeout_seconds) == ("tcp", 7.0)
    for field in SETTINGS:
        assert getattr(options, field) == getattr(defaults, field), field
    assert _env.segment_bytes() == defaults.segment_bytes
    assert _env.small_bytes() == defaults.small_bytes


def test_set_settings_reach_their_options_field(no_settings):
    values = {
        "segment_bytes": 4096,
        "small_bytes": 1000,
        "algorithm": "ring",
        "tcp_streams": 3,
        "tcp_keepalive_seconds": 4,
        "spin_us": 7,
        "shm_single_copy_bytes": 1 << 20,
        "shm_slot_bytes": 8192,
        "device_staging_bytes": 1 << 21,
        "device_land_in_place": 1,
        "stream_store_bytes": 1 << 22,
        "host_id": "host-7",
        "socket_addr": "10.0.0.7",
    }
    for field, value in values.items():
        no_settings.setenv(SETTINGS[field], str(value))
    options = _env.engine_options("auto", 1.0)
    assert {field: getattr(options, field) for field in SETTINGS} == values


@pytest.mark.parametrize(
    "var, text",
    [
        ("RINGREDUCE_SEGMENT_BYTES", "0"),
        ("RINGREDUCE_SEGMENT_BYTES", "lots"),
        ("RINGREDUCE_SMALL_BYTES", "-1"),
        ("RINGREDUCE_SMALL_BYTES", "64k"),
        ("RINGREDUCE_TCP_STREAMS", "17"),
        ("RINGREDUCE_TCP_KEEPALIVE", "-1"),
        ("RINGREDUCE_TCP_KEEPALIVE", "15s"),
        ("RINGREDUCE_DEVICE_STAGING_BYTES", "-1"),
        ("RINGREDUCE_DEVICE_STAGING_BYTES", "4M"),
        ("RINGREDUCE_DEVICE_IN_PLACE", "2"),
        ("RINGREDUCE_DEVICE_IN_PLACE", "yes"),
    ],
)
def test_a_bad_setting_names_its_variable(no_settings, var, text):
    no_settings.setenv(var, text)
    with pytest.raises(ValueError, match=var):
        _env.engine_options("auto", 1.0)


def test_launcher_variables_are_read_here(env, monkeypatch):
    monkeypatch.delenv("RINGREDUCE_TOKEN", raising=False)
    assert _env.transport_setting() is None
    assert _env.master_addr() is None
    assert _env.token() == ""
    assert not _env.launched_with_rank()
    assert _env.launcher_rank() is None
    env(RINGREDUCE_TRANSPORT="shm", MASTER_ADDR="10.0.0.3", RINGREDUCE_TOKEN="s3cret")
    assert _env.transport_setting() == "shm"
    assert _env.master_addr() == "10.0.0.3"
    assert _env.token() == "s3cret"
    env(OMPI_COMM_WORLD_RANK="2", OMPI_COMM_WORLD_SIZE="4")
    assert _env.launcher_rank() == "2"
    assert not _env.launched_with_rank()
    env(RANK="1", WORLD_SIZE="4")
    assert _env.launcher_rank() == "1"  # the first launcher that says, as rank_and_size
    assert _env.launched_with_rank()


@pytest.mark.parametrize(
    "text, log_algorithm",
    [("faults", False), ("algorithm,faults", True), ("all", True), ("", False)],
)
def test_every_debug_topic_is_known(no_settings, text, log_algorithm):
    # "faults" is read by _core as it loads; init() must not call it unknown.
    no_settings.setenv("RINGREDUCE_DEBUG", text)
    assert _env.engine_options("auto", 1.0).log_algorithm == log_algorithm
    no_settings.setenv("RINGREDUCE_DEBUG", text + ",nonsense")
    with pytest.raises(ValueError, match="unknown topic"):
        _env.engine_options("auto", 1.0)
