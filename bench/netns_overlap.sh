#!/usr/bin/env bash
# bench/overlap.py on H emulated hosts of L ranks each, links shaped to RATE
# (network namespaces, bench/netns_common.sh; root only), then the cost model's
# prediction for the same gradients, compute time and links, to read the
# measured exposed communication against the model's.
#
#   bench/netns_overlap.sh 4 1 1gbit --width 1024 --depth 4 --steps 6 --runs 2
#
# Ranks are numbered host by host. Rank 0's table is printed, then
# `ringreduce model` with the measured compute step (mode "compute") and the
# gradient bytes from that table.
set -euo pipefail
hosts=${1:?hosts}
per_host=${2:?ranks per host}
rate=${3:?link rate, e.g. 1gbit}
shift 3
here=$(cd "$(dirname "$0")" && pwd)
. "$here/netns_common.sh"
emulate_hosts "$hosts" "$rate"
n=$((hosts * per_host))
out=$(mktemp)
random_port
for r in $(seq 0 $((n - 1))); do
  sink=/dev/null
  [ "$r" = 0 ] && sink=$out
  start_rank "$r" "$n" "$per_host" "$RR_PORT" GLOO_SOCKET_IFNAME="veth$((r / per_host))" \
    timeout 1800 python "$here/overlap.py" "$@" >"$sink" 2>&1
done
status=0
wait_ranks || status=1
echo "== bench/overlap.py $*, $hosts hosts x $per_host ranks, $rate links"
cat "$out"
# The model for the same step: gradients and compute time from the table above.
grad_mb=$(sed -n 's/.*(\([0-9.]*\) MB float32 gradients).*/\1/p' "$out")
compute_ms=$(sed -n 's/^| compute | \([0-9.]*\) .*/\1/p' "$out")
rm -f "$out"
if [ -n "$grad_mb" ] && [ -n "$compute_ms" ]; then
  gbps=$(python -c "import re,sys; v,u=re.match(r'([0-9.]+)([kmg]?)bit',sys.argv[1]).groups(); print(float(v)*{'k':1e-6,'m':1e-3,'g':1}[u])" "$rate")
  echo "== ringreduce model, the same step"
  python -m ringreduce model --grad-bytes "$(python -c "print(int(float('$grad_mb')*1e6))")" \
    --compute-s "$(python -c "print(float('$compute_ms')/1e3)")" --hosts "$hosts" \
    --ranks-per-host "$per_host" --link-gbps "$gbps"
fi
exit $status
