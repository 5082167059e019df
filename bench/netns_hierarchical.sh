#!/usr/bin/env bash
# Flat ring vs hierarchical all_reduce across H emulated hosts of L ranks each,
# with links shaped to RATE (network namespaces, bench/netns_common.sh; root only).
# Ranks are numbered host by host; rank 0's table for each algorithm is printed.
#
#   bench/netns_hierarchical.sh 2 2 1gbit -b 16M -e 64M -f 4 -i 5 -r 3
set -euo pipefail
hosts=${1:?hosts}
per_host=${2:?ranks per host}
rate=${3:?link rate, e.g. 1gbit}
shift 3
. "$(dirname "$0")/netns_common.sh"
emulate_hosts "$hosts" "$rate"
n=$((hosts * per_host))
out=$(mktemp)
for algo in ring hierarchical; do
  random_port
  for r in $(seq 0 $((n - 1))); do
    sink=/dev/null
    [ "$r" = 0 ] && sink=$out
    start_rank "$r" "$n" "$per_host" "$RR_PORT" RINGREDUCE_ALGORITHM="$algo" \
      python -m ringreduce bench "$@" >"$sink" 2>&1
  done
  wait_ranks
  echo "== RINGREDUCE_ALGORITHM=$algo, $hosts hosts x $per_host ranks, $rate links"
  cat "$out"
done
rm -f "$out"
