"""ringreduce without its optional bfloat16 dependency (ml_dtypes): what a plain
``pip install .`` gives. Import, float32 and float16 collectives and compression of
float32 data work; asking for bfloat16 fails with an error that names what to install."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture
def hidden_ml_dtypes(tmp_path):
    """An environment in which ``import ml_dtypes`` fails, as where it is not installed:
    a module of that name, first on the path, that raises ModuleNotFoundError."""
    (tmp_path / "ml_dtypes.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'ml_dtypes'\", name='ml_dtypes')\n"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(tmp_path), HERE] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    for var in ("RANK", "WORLD_SIZE", "RINGREDUCE_TRANSPORT"):
        env.pop(var, None)
    return env


def _run(args: list, env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        stdin=subprocess.DEVNULL,
    )


def test_hidden_module_really_fails(hidden_ml_dtypes):
    r = _run(["-c", "import ml_dtypes"], hidden_ml_dtypes)
    assert r.returncode != 0 and "ModuleNotFoundError" in r.stderr


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_collectives_and_compression_without_ml_dtypes(hidden_ml_dtypes, transport):
    rank = os.path.join(HERE, "_no_ml_dtypes_rank.py")
    cmd = ["-m", "ringreduce", "launch", "-n", "2", "--transport", transport, "--", rank]
    r = _run(cmd, hidden_ml_dtypes)
    assert r.returncode == 0, r.stdout + r.stderr
    seen = [json.loads(line.split("] ", 1)[1]) for line in r.stdout.splitlines() if "{" in line]
    assert len(seen) == 2, r.stdout
    for s in seen:
        assert s["ml_dtypes_at_import"] is False and s["ml_dtypes_at_end"] is False
        assert s["exact"] is True and s["float16"] is True
        # Each codec ran (its bytes counted, an error above 0) and kept its bound.
        assert s["wire_codecs"] == ["bf16", "fp16", "int8"], s
        assert 0 < s["int8"] < 0.02 and 0 < s["fp16"] < 1e-3 and 0 < s["bf16"] < 0.01, s
        assert "needs ml_dtypes" in s["bfloat16"] and "ringreduce[bf16]" in s["bfloat16"]


def test_bfloat16_bench_refused_naming_the_extra(hidden_ml_dtypes):
    r = _run(["-m", "ringreduce", "bench", "-n", "2", "-d", "bfloat16"], hidden_ml_dtypes)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "-d/--dtype" in r.stderr and "ringreduce[bf16]" in r.stderr and r.stdout == ""


def test_command_line_without_ml_dtypes(hidden_ml_dtypes):
    for args in (["--help"], ["bench", "--help"], ["--version"], ["info"]):
        r = _run(["-m", "ringreduce", *args], hidden_ml_dtypes)
        assert r.returncode == 0, (args, r.stderr)
