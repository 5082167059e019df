#!/usr/bin/env bash
# ringreduce bench across N emulated hosts with shaped links, next to Gloo in
# the same run. Needs root. Creates the namespaces, runs, removes them.
#
#   bench/netns_bench.sh 4 1gbit -e 64M         # extra args go to ringreduce bench
set -euo pipefail
n=${1:?number of hosts}
rate=${2:?link rate, e.g. 1gbit}
shift 2
. "$(dirname "$0")/netns_common.sh"
emulate_hosts "$n" "$rate"
random_port
for i in $(seq 0 $((n - 1))); do
  out=/dev/null
  [ "$i" = 0 ] && out=/dev/stdout
  start_rank "$i" "$n" 1 "$RR_PORT" GLOO_SOCKET_IFNAME="veth$i" \
    python -m ringreduce bench "$@" >"$out"
done
status=0
wait_ranks || status=1
exit $status
