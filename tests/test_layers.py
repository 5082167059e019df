"""The package's rooms import only downwards (tools/import_layers.py), and the checker
catches an import that goes up, sideways, or through the package's face. The engine's
folders include only downwards too (tools/include_layers.py): no two include each other."""

from __future__ import annotations

import importlib.util
import os
import sys
import textwrap

import pytest

_TOOLS = os.path.join(os.path.dirname(__file__), os.pardir, "tools")
_TOOL = os.path.join(_TOOLS, "import_layers.py")
pytestmark = pytest.mark.skipif(
    not os.path.exists(_TOOL), reason="runs from a source checkout (tools/import_layers.py)"
)


def _tool(name="import_layers"):
    spec = importlib.util.spec_from_file_location(name, os.path.join(_TOOLS, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_package_imports_only_downwards():
    assert _tool().check() == []


@pytest.mark.parametrize(
    "where, source, offence",
    [
        ("_arrays/bad.py", "from .._comm import communicator\n", "a higher layer"),
        ("bucketing/bad.py", "def f():\n    from ..bench import parse_size\n", "its layer"),
        ("_comm/bad.py", "import ringreduce\n", "a higher layer"),
        ("model/bad.py", "from ringreduce.torch import GradSync\n", "a higher layer"),
        ("newroom/bad.py", "x = 1\n", "has no layer"),
        ("_comm/compressed/bad.py", "from ..membership import growth\n", "another sub-room"),
        ("_comm/core/bad.py", "from .. import communicator\n", "a higher layer"),
    ],
)
def test_an_import_against_the_layers_is_named(tmp_path, where, source, offence):
    tool = _tool()
    root = tmp_path / "ringreduce"
    target = root / where
    target.parent.mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (target.parent / "__init__.py").write_text("")
    target.write_text(textwrap.dedent(source))
    problems = tool.check(root)
    # One line per offending file (a new room's __init__.py has no layer either).
    assert problems and all(offence in p for p in problems), problems
    assert all(where.split("/")[0] in p for p in problems), problems


def test_downward_and_same_room_imports_pass(tmp_path):
    tool = _tool()
    root = tmp_path / "ringreduce"
    (root / "_comm" / "core").mkdir(parents=True)
    (root / "__init__.py").write_text("from ._comm.core.work import Work\n")
    (root / "_comm" / "__init__.py").write_text("")
    (root / "_comm" / "core" / "__init__.py").write_text("")
    (root / "_comm" / "core" / "work.py").write_text(
        "from ... import _core, errors\nfrom ..._arrays.buffer import describe\nfrom . import ops\n"
    )
    # A sub-room above the core imports it: downwards too.
    (root / "_comm" / "communicator.py").write_text("from .core import work\n")
    assert tool.check(root) == []


def test_the_engine_includes_only_downwards():
    assert _tool("include_layers").check() == []


@pytest.mark.parametrize(
    "where, source, offence",
    [
        # The cycle there was: an executor taking the schedule's Ring.
        ("executor/bad.cc", '#include "algorithms/schedule.h"\n', "a higher layer"),
        ("transport/bad.h", '#include "engine/options.h"\n', "a higher layer"),
        ("reduce/bad.cc", '#include "security/secret.h"\n', "another folder of its layer"),
        ("newfolder/bad.cc", '#include "common/error.h"\n', "has no layer"),
    ],
)
def test_an_include_against_the_layers_is_named(tmp_path, where, source, offence):
    tool = _tool("include_layers")
    target = tmp_path / where
    target.parent.mkdir(parents=True)
    target.write_text(source)
    problems = tool.check(tmp_path)
    assert len(problems) == 1 and offence in problems[0], problems
    assert problems[0].startswith(where), problems


def test_downward_and_same_folder_includes_pass(tmp_path):
    tool = _tool("include_layers")
    (tmp_path / "algorithms").mkdir()
    (tmp_path / "algorithms" / "ring.cc").write_text(
        '#include "algorithms/schedule.h"\n#include "executor/executor.h"\n'
        '#include "common/error.h"\n#include <vector>\n#include "config.h"\n'
    )
    assert tool.check(tmp_path) == []
