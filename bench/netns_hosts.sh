#!/usr/bin/env bash
# Emulates N hosts on one machine: network namespaces rrhost0..N-1, each with a
# veth link into a shared bridge, shaped to RATE (tc tbf) in both directions.
# Needs root. Traffic stays inside these namespaces.
#
#   bench/netns_hosts.sh up 4 1gbit     # create, 10.231.0.1 .. 10.231.0.4
#   ip netns exec rrhost1 python ...    # run a rank on "host" 1
#   bench/netns_hosts.sh down 4
set -euo pipefail
cmd=${1:?up|down}
n=${2:?number of hosts}
rate=${3:-1gbit}
. "$(dirname "$0")/netns_common.sh"

if [ "$cmd" = down ]; then
  hosts_down "$n"
  exit 0
fi
hosts_up "$n" "$rate"
