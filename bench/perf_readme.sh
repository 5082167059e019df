#!/usr/bin/env bash
# Regenerates the README's Performance tables and plots: all_reduce float32
# sum, 8 B to 256 MB, 2 and 4 ranks under mpirun, ours over shared memory
# (transport auto on one host), TCP and MPI, next to MPI_Allreduce (mpi4py) and
# torch's Gloo timed in the same runs, with one core's memcpy as the yardstick.
#   bash bench/perf_readme.sh [outdir]      (default docs/perf)
set -euo pipefail
out=${1:-docs/perf}
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe
here=$(cd "$(dirname "$0")" && pwd)
for n in 2 4; do
  for t in shm tcp mpi; do
    mpirun -np "$n" python -m ringreduce bench --transport "$t" -b 8 -e 256M -f 4 \
      --compare mpi,gloo --json "$out/n${n}_${t}.json" | tee "$out/n${n}_${t}.txt"
  done
  python "$here/plot_runs.py" "$out/n${n}_shm.json" "$out/n${n}_tcp.json" "$out/n${n}_mpi.json" \
    -o "$out/allreduce_n${n}.png"
done
