#!/usr/bin/env bash
# ThreadSanitizer over the engine: the ranks of a job as threads of one C++
# process (ranks_in_threads.cc), built with -fsanitize=thread. Any report fails.
#   bash bench/sanitize/run_tsan.sh [ranks] [churn cycles: communicators per rank, default 50]
set -euo pipefail
cd "$(dirname "$0")/../.."
build="${RR_TSAN_DIR:-/tmp/ringreduce-tsan}"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DRINGREDUCE_SANITIZE=thread -DRINGREDUCE_WITH_CUDA=OFF -DRINGREDUCE_WITH_MPI=OFF \
  -DRINGREDUCE_SANITIZER_DRIVER=ON \
  -Dpybind11_DIR="$(python -c 'import pybind11; print(pybind11.get_cmake_dir())')" >/dev/null
cmake --build "$build" --target rr_ranks_in_threads
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" "$build/rr_ranks_in_threads" "${1:-4}" 29731 "${2:-50}"
