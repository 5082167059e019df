"""Checks a ringreduce sdist's file list: everything a build and the tests need is
there, nothing built or machine-local is, and (in a git checkout) it holds exactly
the tracked files less those pyproject.toml's ``sdist.exclude`` leaves out.

    python tools/check_sdist.py dist/ringreduce-0.1.0.tar.gz
"""

from __future__ import annotations

import fnmatch
import re
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# What a build from the sdist reads, and what its tests need.
REQUIRED = [
    "PKG-INFO",
    "pyproject.toml",
    "CMakeLists.txt",
    "README.md",
    "LICENSE",
    "NOTICE",
    "csrc/config.h.in",
    "cmake/mpi.cmake",
    "cmake/cuda.cmake",
    "tools/build_backend/ringreduce_build.py",
    "python/ringreduce/__init__.py",
    "python/ringreduce/py.typed",
    "python/ringreduce/_core.pyi",
    "tests/conftest.py",
]
REQUIRED_DIRS = ["csrc/", "python/ringreduce/", "tests/", "examples/", "docs/"]
# Build output and local state that must never ship.
FORBIDDEN = [
    "build/*",
    "dist/*",
    "*.so",
    "*.o",
    "*.pyc",
    "*/__pycache__/*",
    ".git/*",
    "*.egg-info/*",
]
# Tracked files the sdist leaves out on purpose (pyproject.toml: sdist.exclude).
EXCLUDED = [".ci/*", ".gitignore", ".clang-format"]


def sdist_files(path: Path) -> tuple[str, set[str]]:
    """(top-level folder, files relative to it) of an sdist."""
    with tarfile.open(path) as tar:
        names = [m.name for m in tar.getmembers() if m.isfile()]
    tops = {n.split("/", 1)[0] for n in names}
    if len(tops) != 1:
        raise SystemExit(f"{path}: expected one top-level folder, found {sorted(tops)}")
    top = tops.pop()
    return top, {n.split("/", 1)[1] for n in names if "/" in n}


def tracked_files() -> set[str] | None:
    """git's tracked files, or None outside a git checkout."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    files = {f for f in out.decode().split("\0") if f}
    # A file deleted in the work tree but not yet in git is not in the sdist either.
    return {f for f in files if (ROOT / f).is_file()}


def problems(top: str, files: set[str], tracked: set[str] | None) -> list[str]:
    """What is wrong with an sdist whose folder is ``top`` and whose files are ``files``."""
    found = []
    version = re.search(
        r'^__version__ = "([^"]+)"$',
        (ROOT / "python/ringreduce/__init__.py").read_text(encoding="utf-8"),
        re.M,
    )
    if version and top != f"ringreduce-{version.group(1)}":
        found.append(f"folder {top!r}, expected ringreduce-{version.group(1)}")
    found += [f"missing {f}" for f in REQUIRED if f not in files]
    found += [
        f"nothing under {d}" for d in REQUIRED_DIRS if not any(f.startswith(d) for f in files)
    ]
    found += [
        f"must not ship {f}" for f in sorted(files) if any(fnmatch.fnmatch(f, p) for p in FORBIDDEN)
    ]
    if tracked is not None:
        expected = {f for f in tracked if not any(fnmatch.fnmatch(f, p) for p in EXCLUDED)}
        found += [f"tracked but missing: {f}" for f in sorted(expected - files)]
        generated = {"PKG-INFO"}
        found += [f"not tracked by git: {f}" for f in sorted(files - expected - generated)]
    return found


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    top, files = sdist_files(Path(argv[0]))
    found = problems(top, files, tracked_files())
    for p in found:
        print(f"check_sdist: {Path(argv[0]).name}: {p}", file=sys.stderr)
    if not found:
        print(f"check_sdist: {Path(argv[0]).name}: {len(files)} files, as expected")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
