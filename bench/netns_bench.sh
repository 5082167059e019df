#!/usr/bin/env bash
# ringreduce bench across N emulated hosts with shaped links, next to Gloo in
# the same run. Needs root. Creates the namespaces, runs, removes them.
#
#   bench/netns_bench.sh 4 1gbit -e 64M         # extra args go to ringreduce bench
set -euo pipefail
n=${1:?number of hosts}
rate=${2:?link rate, e.g. 1gbit}
shift 2
here=$(cd "$(dirname "$0")" && pwd)
"$here/netns_hosts.sh" up "$n" "$rate" >/dev/null
trap '"$here/netns_hosts.sh" down "$n"' EXIT
port=$((20000 + RANDOM % 20000))
pids=()
for i in $(seq 0 $((n - 1))); do
  out=/dev/null
  [ "$i" = 0 ] && out=/dev/stdout
  ip netns exec "rrhost$i" env RANK="$i" WORLD_SIZE="$n" MASTER_ADDR=10.231.0.1 \
    MASTER_PORT="$port" GLOO_SOCKET_IFNAME="veth$i" \
    python -m ringreduce bench "$@" >"$out" &
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
exit $status
