#!/usr/bin/env bash
# Intel MPI's own all_reduce times on this host, from its C benchmark (IMB-MPI1
# Allreduce: float32 sum, shared memory, t_avg in microseconds), the strongest
# CPU anchor we know of for one host. Intel MPI comes from PyPI (impi-rt,
# impi-devel) into a virtual environment of its own, so that its mpirun never
# shadows Open MPI's.
#   bash bench/imb_allreduce.sh N [VENV]    (VENV default: /tmp/impi-venv)
# Prints "bytes t_avg_us", one line per size, 8 B to 64 MB.
set -euo pipefail
n=${1:?number of ranks}
venv=${2:-/tmp/impi-venv}
if [ ! -x "$venv/bin/IMB-MPI1" ]; then
  python3 -m venv "$venv" && "$venv/bin/pip" install -q impi-rt impi-devel >/dev/null
fi
export PATH=$venv/bin:$PATH I_MPI_FABRICS=shm I_MPI_ROOT=$venv
export LD_LIBRARY_PATH=$venv/lib:$venv/lib/release${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
echo "# Intel MPI IMB-MPI1 Allreduce, np=$n, float32 sum, shm: bytes t_avg_us"
mpirun -np "$n" IMB-MPI1 Allreduce -npmin "$n" -msglog 3:26 -iter 500 -time 2 2>/dev/null |
  awk '/^ +[0-9]+ / && $1 > 0 {print $1, $5}'
