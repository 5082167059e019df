"""The build backend keeps build/ between `pip install .` runs, and only when that is safe."""

from __future__ import annotations

import json
import os
import sys

import pytest

sk = pytest.importorskip(
    "scikit_build_core", reason="needs scikit-build-core: pip install -e '.[test]' brings it"
)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools", "build_backend"))
import ringreduce_build  # noqa: E402

OLD = "/tmp/pip-build-env-old/scikit_build_core"


def _record(tmp_path, name, **changes):
    info = {
        "source_dir": os.fspath(tmp_path.resolve()),
        "build_dir": os.fspath((tmp_path / "build" / name).resolve()),
        "cmake_path": "/tmp/pip-build-env-old/cmake",
        "skbuild_path": OLD,
        "skbuild_version": sk.__version__,
        "python_executable": sys.executable,
    }
    info.update(changes)
    path = tmp_path / "build" / name / ".skbuild-info.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(info))
    return path


def test_a_build_dir_of_an_earlier_isolated_build_is_kept(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ours = os.fspath(os.path.dirname(sk.__file__))
    same = _record(tmp_path, "same")
    other_python = _record(tmp_path, "python", python_executable="/usr/bin/python-other")
    other_version = _record(tmp_path, "version", skbuild_version="0.0.1")
    other_source = _record(tmp_path, "source", source_dir="/elsewhere")
    broken = tmp_path / "build" / "broken" / ".skbuild-info.json"
    broken.parent.mkdir(parents=True)
    broken.write_text("{not json")

    ringreduce_build._adopt_build_dirs()

    assert json.loads(same.read_text())["skbuild_path"] == ours
    for left in (other_python, other_version, other_source):
        assert json.loads(left.read_text())["skbuild_path"] == OLD
    assert broken.read_text() == "{not json"


def test_the_backend_offers_every_hook_of_scikit_build_core():
    from scikit_build_core import build

    hooks = [n for n in dir(build) if n.startswith(("build_", "get_requires_", "prepare_"))]
    assert "build_wheel" in hooks and "build_sdist" in hooks
    for name in hooks:
        assert callable(getattr(ringreduce_build, name)), name
