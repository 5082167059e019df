#!/usr/bin/env bash
# Builds ringreduce with the CUDA kernels (required: the build fails if nvcc is
# missing) and runs bench/gpu_check.py on this machine's GPU, then, where torch
# sees the GPU, bench/gpu_transports.py (the device all_reduce, staged and over
# device windows, against Gloo's, our host path and the device's own copies),
# bench/gpu_sync_probe.py (what one copy and synchronize costs),
# bench/gpu_staging_probe.py (how fast pinned, page-locked shared and pageable
# host memory feed and drain the GPU) and bench/gpu_flag_probe.py (what a
# barrier between two processes on the GPU costs through the host, the
# stream's own flag operations and a spinning kernel, and under MPS;
# RR_GPU_CHECK_NO_BENCH=1 skips all four), then the GPU tests
# (RR_GPU_CHECK_NO_TESTS=1 skips them). Arguments go to gpu_check.py (--seed S
# to replay a run). Exit status: the check's, or 1 if it passed and a test
# failed. Set RR_GPU_CHECK_NO_BUILD=1 to test the ringreduce already installed
# instead. It replaces any installed ringreduce with an editable install of
# this tree.
#
# The build needs no network: pip runs without build isolation, so
# scikit-build-core, pybind11, cmake and ninja must already be installed
# (pip install scikit-build-core pybind11 cmake ninja numpy). PYTHON names the
# interpreter: default python3, the name every Python 3 install provides (a
# plain "python" may be missing or another one).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

if [[ "${RR_GPU_CHECK_NO_BUILD:-0}" != 1 ]]; then
  if ! command -v nvcc >/dev/null && [[ -z "${CUDACXX:-}" ]] && [[ -x /usr/local/cuda/bin/nvcc ]]; then
    export CUDACXX=/usr/local/cuda/bin/nvcc
  fi
  echo "gpu_check: building ringreduce with CUDA into build/gpu ..." >&2
  "$PYTHON" -m pip install --no-build-isolation --no-deps -q -e . -Cbuild-dir=build/gpu \
    -Ccmake.define.RINGREDUCE_WITH_CUDA=ON
fi

# On an H200 (16 cores) the build took 25 s, the check 31 s, the bench 26 s (before
# its third transport), the sync probe about 10 s and the tests 45 s. Not yet run
# on a GPU: the staging probe (its 60 s allow for torch starting three times and
# about 20 GB of copies) and the flag probe (at most 3 s per way and rank by its
# own deadlines, six ways, two pairs of processes started: about 30 s at worst).
# The timeouts, 3-4x those, turn a hang into a failure and keep the whole run
# under 10 minutes, inside a device lease.
status=0
timeout 100 "$PYTHON" bench/gpu_check.py "$@" || status=$?
if [[ "${RR_GPU_CHECK_NO_BENCH:-0}" != 1 ]] &&
  "$PYTHON" -c "import sys, torch; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
  # Shared memory four times: as it is (through pinned staging memory, in batches),
  # with segments copied between the GPU and the inboxes directly (no host copy, a
  # copy per segment), with messages read by address (one host copy per byte), and
  # as it is under MPS (both ranks' work in one server: no time slicing).
  timeout 150 "$PYTHON" bench/gpu_transports.py -n 2 \
    --transports shm,shm:RINGREDUCE_DEVICE_IN_PLACE=1,shm:RINGREDUCE_SHM_SINGLE_COPY_BYTES=65536,shm:MPS,tcp \
    --sizes 8,64K,1M,16M,256M || echo "gpu_transports failed (status $?)" >&2
  timeout 30 "$PYTHON" bench/gpu_sync_probe.py || echo "gpu_sync_probe failed (status $?)" >&2
  timeout 60 "$PYTHON" bench/gpu_staging_probe.py || echo "gpu_staging_probe failed (status $?)" >&2
  timeout 50 "$PYTHON" bench/gpu_flag_probe.py --timeout 3 ||
    echo "gpu_flag_probe failed (status $?)" >&2
fi
if [[ "${RR_GPU_CHECK_NO_TESTS:-0}" != 1 ]]; then
  timeout 170 "$PYTHON" -m pytest -q -n 8 -p no:cacheprovider tests/test_cuda.py \
    tests/test_cuda_build.py tests/test_compression_device.py tests/test_device_staging.py \
    tests/test_torch_cuda.py ||
    { [[ "$status" != 0 ]] || status=1; }
fi
exit "$status"
