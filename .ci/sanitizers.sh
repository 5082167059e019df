#!/usr/bin/env bash
# The engine under sanitizers: builds the C++ core with -fsanitize=$1
# (default address,undefined) into a directory of its own and runs the tests
# that drive the C++'s parsers and failure handling hardest (the store under
# hostile connections and wrong tokens, the parsers' fuzzer, the rendezvous,
# shared memory with its failure paths, segments that lie, windows read in place by
# their peers, communicators made and closed hundreds of times in a row, the compressed
# collective's schedule against the Python path's bits, the reduction kernels
# on buffers with guards past their ends, the staged device pipeline on the CPU
# emulation of a GPU, over TCP and into and out of shared memory) against it,
# with the sanitizer's runtime preloaded into Python. Any report fails the run.
#
#   bash .ci/sanitizers.sh                     # ASan + UBSan
#   bash .ci/sanitizers.sh thread tests/test_shm.py   # TSan, chosen tests
set -euo pipefail
cd "$(dirname "$0")/.."

sanitize="${1:-address,undefined}"
shift || true
tests=("$@")
if [ ${#tests[@]} -eq 0 ]; then
  tests=(tests/test_security.py tests/test_rendezvous.py tests/test_shm.py
         tests/test_shm_segments.py tests/test_churn.py tests/test_windows.py
         tests/test_compression_engine.py tests/test_device_windows.py tests/test_functors.py
         tests/test_device_staging.py)
fi
name="$(echo "$sanitize" | tr ',' '-')"
# Inside this checkout's (ignored) build/ unless told otherwise, so that a
# build of another checkout is never reused.
build="${RR_SANITIZE_DIR:-$PWD/build/sanitize-$name}"

# The build requirements, in this environment: the build below skips pip's
# isolated one so that the sanitizer flags reach CMake as given.
python -m pip install --quiet "scikit-build-core>=0.11" "pybind11>=2.12" ninja cmake
python -m pip install --quiet --no-build-isolation --no-deps --upgrade --target "$build/site" \
  -C build-dir="$build/build" \
  -C cmake.define.RINGREDUCE_SANITIZE="$sanitize" \
  -C cmake.define.RINGREDUCE_WITH_CUDA=OFF \
  -C cmake.define.RINGREDUCE_WITH_MPI=OFF \
  -C cmake.build-type=RelWithDebInfo \
  .

runtime=()
case "$sanitize" in
  *address*) runtime+=("$(g++ -print-file-name=libasan.so)") ;;
  *thread*) runtime+=("$(g++ -print-file-name=libtsan.so)") ;;
esac
case "$sanitize" in
  *undefined*) runtime+=("$(g++ -print-file-name=libubsan.so)") ;;
esac

# Python itself is not built with the sanitizer: leaks at exit are the
# interpreter's, so leak checking is off; everything else stops the process.
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:halt_on_error=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:report_signal_unsafe=0"
export LD_PRELOAD="${runtime[*]}"
# The sanitized build must be the ringreduce the tests import. An editable install
# of this tree hooks the import system ahead of PYTHONPATH; a sitecustomize that
# drops its hook keeps it out (rank processes inherit the setting), and the check
# below fails loudly rather than test the unsanitized build.
mkdir -p "$build/no-editable"
cat > "$build/no-editable/sitecustomize.py" <<'PY'
import sys

sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "ScikitBuildRedirectingFinder"]
PY
export PYTHONPATH="$build/site:$build/no-editable"
python - "$build/site" <<'PY'
import os
import sys

import ringreduce._core as core

if not os.path.realpath(core.__file__).startswith(os.path.realpath(sys.argv[1])):
    sys.exit(f"sanitizers: ringreduce imports from {core.__file__}, not the sanitized build")
PY
# The tests import the package from PYTHONPATH; run them from outside the source tree
# so that python/ringreduce there is not picked up by accident.
cd tests
python -m pytest -q -p no:cacheprovider -o addopts="" -c ../pyproject.toml --rootdir .. \
  "${tests[@]/#tests\//}" -k "not gpu and not mpi"
