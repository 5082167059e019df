# shellcheck shell=bash
# Emulated hosts on one machine, shared by the netns_*.sh scripts (source it; root
# only): network namespaces rrhost0..N-1, each with a veth link into a bridge that
# lives in namespace rrswitch, shaped to a rate (tc tbf) in both directions, and
# ranks started in them, numbered host by host.

RR_BRIDGE=rrbr0
RR_SUBNET=10.231.0
RR_MASTER_ADDR=$RR_SUBNET.1 # rrhost0
RR_PIDS=()

# make_switch: the bridge, in its own namespace, so nothing touches the host's network.
make_switch() {
  ip netns add rrswitch
  ip -n rrswitch link add "$RR_BRIDGE" type bridge
  ip -n rrswitch link set "$RR_BRIDGE" up
}

# make_host I: namespace rrhostI, address $RR_SUBNET.(I+1), linked to the bridge
# (vethI inside, portI on the switch).
make_host() {
  local i=$1 ns="rrhost$1"
  ip netns add "$ns"
  ip link add "veth$i" netns "$ns" type veth peer name "port$i" netns rrswitch
  ip -n "$ns" addr add "$RR_SUBNET.$((i + 1))/24" dev "veth$i"
  ip -n "$ns" link set "veth$i" up
  ip -n "$ns" link set lo up
  ip -n rrswitch link set "port$i" master "$RR_BRIDGE"
  ip -n rrswitch link set "port$i" up
}

# shape I RATE: both directions of host I's link, egress of its end and of the switch port.
shape() {
  local i=$1 rate=$2 burst=$((256 * 1024))
  ip netns exec "rrhost$i" tc qdisc add dev "veth$i" root tbf rate "$rate" burst "$burst" latency 50ms
  ip netns exec rrswitch tc qdisc add dev "port$i" root tbf rate "$rate" burst "$burst" latency 50ms
}

# hosts_up N RATE: N hosts on links of RATE; prints their addresses.
hosts_up() {
  local n=$1 rate=$2 i
  make_switch
  for i in $(seq 0 $((n - 1))); do
    make_host "$i"
    shape "$i" "$rate"
  done
  echo "hosts: $(for i in $(seq 0 $((n - 1))); do printf '%s.%d ' "$RR_SUBNET" $((i + 1)); done)"
}

# hosts_down N: removes hosts 0..N-1 and the switch; quiet about what is not there.
hosts_down() {
  local i
  for i in $(seq 0 $(($1 - 1))); do ip netns del "rrhost$i" 2>/dev/null || true; done
  ip netns del rrswitch 2>/dev/null || true
}

# emulate_hosts N RATE: hosts_up quietly, and hosts_down when the script exits.
emulate_hosts() {
  hosts_up "$1" "$2" >/dev/null
  # shellcheck disable=SC2064 # N is fixed now
  trap "hosts_down $1" EXIT
}

# start_rank RANK WORLD PER_HOST PORT [VAR=VALUE ...] CMD ...: CMD in the background as
# RANK of WORLD, in host RANK / PER_HOST, rank 0's host the master; its pid joins
# RR_PIDS. Redirect the call to redirect the rank's output.
start_rank() {
  local rank=$1 world=$2 per_host=$3 port=$4
  shift 4
  ip netns exec "rrhost$((rank / per_host))" env RANK="$rank" WORLD_SIZE="$world" \
    MASTER_ADDR="$RR_MASTER_ADDR" MASTER_PORT="$port" "$@" &
  RR_PIDS+=($!)
}

# wait_ranks: waits for every rank started; returns the first failed one's status, if any.
wait_ranks() {
  local p code status=0
  for p in "${RR_PIDS[@]}"; do
    code=0
    wait "$p" || code=$?
    [ "$status" != 0 ] || status=$code
  done
  RR_PIDS=()
  return "$status"
}

# random_port: a port for one job's rendezvous, into RR_PORT.
random_port() {
  RR_PORT=$((20000 + RANDOM % 20000))
}
