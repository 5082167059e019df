"""The package's rooms import only downwards (tools/import_layers.py), and the checker
catches an import that goes up, sideways, or through the package's face."""

from __future__ import annotations

import importlib.util
import os
import sys
import textwrap

import pytest

_TOOL = os.path.join(os.path.dirname(__file__), os.pardir, "tools", "import_layers.py")
pytestmark = pytest.mark.skipif(
    not os.path.exists(_TOOL), reason="runs from a source checkout (tools/import_layers.py)"
)


def _tool():
    spec = importlib.util.spec_from_file_location("import_layers", _TOOL)
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
