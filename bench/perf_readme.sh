#!/usr/bin/env bash
# Regenerates the README's Performance tables and plots: all_reduce float32
# sum, 8 B to 64 MB, 2 and 4 ranks under mpirun, ours over shared memory
# (transport auto on one host), TCP and MPI, next to MPI_Allreduce (mpi4py) and
# torch's Gloo timed in the same runs, with one core's memcpy as the yardstick and,
# over shared memory, ours on comm.empty arrays (--compare window);
# then Intel MPI's own C benchmark on the same host (bench/imb_allreduce.sh;
# skipped with RINGREDUCE_NO_IMB=1 or where Intel MPI cannot be installed), and
# the README's table from all of them (bench/readme_table.py).
#   bash bench/perf_readme.sh [outdir]      (default docs/perf)
# Everything is measured in SWEEPS whole sweeps (default 3), one after the
# other, and the table takes each figure's median over them: on a shared
# virtual machine one sweep can hold a 5-10x outlier at a single size. The
# first sweep's files are n{2,4}_{shm,tcp,mpi}.{txt,json} and imb_n{2,4}.txt
# (the plots are drawn from it); sweep k's add .sweepK before the suffix.
set -euo pipefail
out=${1:-docs/perf}
sweeps=${SWEEPS:-3}
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe
here=$(cd "$(dirname "$0")" && pwd)
rm -f "$out"/*.sweep[0-9]*.*
for k in $(seq 1 "$sweeps"); do
  tag=$([ "$k" = 1 ] && echo "" || echo ".sweep$k")
  for n in 2 4; do
    for t in shm tcp mpi; do
      # Over shared memory, ours on comm.empty arrays too (the window path), timed
      # before the others in each round, as ours on numpy arrays is.
      compare=$([ "$t" = shm ] && echo window, || true)mpi,gloo
      mpirun -np "$n" python -m ringreduce bench --transport "$t" -b 8 -e 64M -f 2 \
        --compare "$compare" --json "$out/n${n}_${t}${tag}.json" | tee "$out/n${n}_${t}${tag}.txt"
    done
  done
  if [ -z "${RINGREDUCE_NO_IMB:-}" ]; then
    for n in 2 4; do
      bash "$here/imb_allreduce.sh" "$n" > "$out/imb_n${n}${tag}.txt" ||
        rm -f "$out/imb_n${n}${tag}.txt"
    done
  fi
done
for n in 2 4; do
  python "$here/plot_runs.py" "$out/n${n}_shm.json" "$out/n${n}_tcp.json" "$out/n${n}_mpi.json" \
    -o "$out/allreduce_n${n}.png"
done
python "$here/readme_table.py" "$out"
