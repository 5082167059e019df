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
bridge=rrbr0

if [ "$cmd" = down ]; then
  for i in $(seq 0 $((n - 1))); do ip netns del "rrhost$i" 2>/dev/null || true; done
  ip netns del rrswitch 2>/dev/null || true
  exit 0
fi

# The bridge lives in its own namespace too, so nothing touches the host's network.
ip netns add rrswitch
ip -n rrswitch link add "$bridge" type bridge
ip -n rrswitch link set "$bridge" up
for i in $(seq 0 $((n - 1))); do
  ns="rrhost$i"
  ip netns add "$ns"
  ip link add "veth$i" netns "$ns" type veth peer name "port$i" netns rrswitch
  ip -n "$ns" addr add "10.231.0.$((i + 1))/24" dev "veth$i"
  ip -n "$ns" link set "veth$i" up
  ip -n "$ns" link set lo up
  ip -n rrswitch link set "port$i" master "$bridge"
  ip -n rrswitch link set "port$i" up
  # Shape both directions: egress of the host's end and of the switch port.
  burst=$((256 * 1024))
  ip netns exec "$ns" tc qdisc add dev "veth$i" root tbf rate "$rate" burst "$burst" latency 50ms
  ip netns exec rrswitch tc qdisc add dev "port$i" root tbf rate "$rate" burst "$burst" latency 50ms
done
echo "hosts: $(for i in $(seq 0 $((n - 1))); do printf '10.231.0.%d ' $((i + 1)); done)"
