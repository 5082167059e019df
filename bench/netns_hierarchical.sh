#!/usr/bin/env bash
# Flat ring vs hierarchical all_reduce across H emulated hosts of L ranks each,
# with links shaped to RATE (network namespaces, bench/netns_hosts.sh; root only).
# Ranks are numbered host by host; rank 0's table for each algorithm is printed.
#
#   bench/netns_hierarchical.sh 2 2 1gbit -b 16M -e 64M -f 4 -i 5 -r 3
set -euo pipefail
hosts=${1:?hosts}
per_host=${2:?ranks per host}
rate=${3:?link rate, e.g. 1gbit}
shift 3
here=$(cd "$(dirname "$0")" && pwd)
"$here/netns_hosts.sh" up "$hosts" "$rate" >/dev/null
trap '"$here/netns_hosts.sh" down "$hosts"' EXIT
n=$((hosts * per_host))
out=$(mktemp)
for algo in ring hierarchical; do
  port=$((20000 + RANDOM % 20000))
  pids=()
  for r in $(seq 0 $((n - 1))); do
    sink=/dev/null
    [ "$r" = 0 ] && sink=$out
    ip netns exec "rrhost$((r / per_host))" env RANK="$r" WORLD_SIZE="$n" \
      MASTER_ADDR=10.231.0.1 MASTER_PORT="$port" RINGREDUCE_ALGORITHM="$algo" \
      python -m ringreduce bench "$@" >"$sink" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  echo "== RINGREDUCE_ALGORITHM=$algo, $hosts hosts x $per_host ranks, $rate links"
  cat "$out"
done
rm -f "$out"
