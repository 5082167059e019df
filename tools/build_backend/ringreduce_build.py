"""ringreduce's build backend: scikit-build-core's, keeping the build directory
from one ``pip install .`` to the next.

pip builds in a new, isolated environment each time. scikit-build-core notices
that its own path changed and clears CMake's cache and object files, so every
install recompiled everything (minutes on a small machine). Our CMake project
takes nothing from that environment that would make the old build wrong: CMake
itself and ninja are looked up again on every configure, and pybind11's headers
are compiled from a copy at a fixed place in the build directory
(cmake/stable_pybind11.cmake). So when the build directory was made by the same
scikit-build-core version, for the same sources and Python, we tell it so, and
CMake and ninja rebuild only what changed. Anything else (another Python,
another scikit-build-core, an unreadable record) leaves the record alone, and
scikit-build-core starts afresh as it always did.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import scikit_build_core
from scikit_build_core.build import *  # noqa: F403  (the PEP 517 hooks)
from scikit_build_core.build import build_editable as _build_editable
from scikit_build_core.build import build_wheel as _build_wheel

_RECORD = ".skbuild-info.json"


def _adopt_build_dirs() -> None:
    here = Path.cwd().resolve()
    ours = os.fspath(Path(scikit_build_core.__file__).parent)
    for record in here.glob(f"build/*/{_RECORD}"):
        try:
            info = json.loads(record.read_text(encoding="utf-8"))
            same = (
                info.get("source_dir") == os.fspath(here)
                and info.get("skbuild_version") == scikit_build_core.__version__
                and info.get("python_executable") == sys.executable
            )
            if same and info.get("skbuild_path") != ours:
                info["skbuild_path"] = ours
                record.write_text(json.dumps(info, indent=2), encoding="utf-8")
        except (OSError, ValueError, AttributeError):
            continue


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _adopt_build_dirs()
    return _build_wheel(wheel_directory, config_settings, metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    _adopt_build_dirs()
    return _build_editable(wheel_directory, config_settings, metadata_directory)
