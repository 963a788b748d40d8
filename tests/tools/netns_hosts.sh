#!/usr/bin/env bash
# Test hosts in network namespaces (issue 9): N namespaces, each with its own non-loopback
# address on a private test range, joined by veth pairs to a bridge that lives in a namespace of
# its own, so nothing outside this machine is reached and the root namespace is not touched.
# Optionally each host's link is shaped with `tc ... tbf` (rate only: this kernel has no netem).
# For libmwms the namespaces are different hosts: the host id includes the network namespace, so
# shared memory is not used between them and the tcp transport carries their traffic.
#
# Usage:
#   netns_hosts.sh up PREFIX N [RATE]    create PREFIXsw and PREFIXh0..h{N-1}; prints the
#                                         MWMSTEST_HOSTS value ("PREFIXh0=10.231.0.1,...")
#   netns_hosts.sh down PREFIX           delete every namespace named PREFIX*
#   netns_hosts.sh run N [RATE] -- CMD…  up with a fresh prefix, run CMD with MWMSTEST_HOSTS
#                                         exported, then down (also on failure or a signal);
#                                         exits with CMD's status
# RATE is a tc rate such as 1gbit or 100mbit. The multiproc launcher (tests/multiproc/launcher.h)
# reads MWMSTEST_HOSTS and starts each rank inside its host's namespace, with that host's address
# in TF_CONFIG. Needs root and iproute2 (`ip`, `tc`); without them `run` exits 77, which CTest
# reports as skipped (SKIP_RETURN_CODE), and says why.
set -euo pipefail

subnet=10.231.0

skip() { echo "netns_hosts.sh: skipped: $*"; exit 77; }

up() {
  local p=$1 n=$2 rate=${3:-}
  [[ $n =~ ^[0-9]+$ ]] && (( n >= 1 && n <= 32 )) || { echo "netns_hosts.sh: N must be 1..32" >&2; exit 2; }
  ip netns add "${p}sw"
  ip -n "${p}sw" link add br0 type bridge
  ip -n "${p}sw" link set br0 up
  local hosts="" i
  for (( i = 0; i < n; i++ )); do
    local h="${p}h$i"
    ip netns add "$h"
    ip -n "${p}sw" link add "h$i" type veth peer name eth0 netns "$h"
    ip -n "${p}sw" link set "h$i" master br0 up
    ip -n "$h" addr add "$subnet.$((i + 1))/24" dev eth0
    ip -n "$h" link set eth0 up
    ip -n "$h" link set lo up
    if [[ -n $rate ]]; then
      # Egress of every host: each direction of a flow is shaped at its sender.
      ip netns exec "$h" tc qdisc add dev eth0 root tbf rate "$rate" burst 256kb latency 100ms
    fi
    hosts+="${hosts:+,}$h=$subnet.$((i + 1))"
  done
  # STP is off on a new bridge: its ports forward as soon as they are up (no forward delay).
  echo "$hosts"
}

down() {
  local p=$1 ns
  for ns in $(ip netns list | awk '{print $1}' | grep "^$p" || true); do
    ip netns pids "$ns" 2> /dev/null | xargs -r kill -9 2> /dev/null || true
    ip netns del "$ns" || true
  done
}

case ${1:-} in
  up) shift; up "$@" ;;
  down) shift; down "$1" ;;
  run)
    shift
    n=$1; shift
    rate=""
    if [[ ${1:-} != -- ]]; then rate=$1; shift; fi
    [[ ${1:-} == -- ]] || { echo "usage: netns_hosts.sh run N [RATE] -- CMD..." >&2; exit 2; }
    shift
    [[ $(id -u) -eq 0 ]] || skip "needs root to create network namespaces"
    command -v ip > /dev/null || skip "no 'ip' (Debian package iproute2)"
    [[ -z $rate ]] || command -v tc > /dev/null || skip "no 'tc' (Debian package iproute2)"
    prefix="mwt$$"
    ip netns add "${prefix}probe" 2> /dev/null || skip "this machine refuses 'ip netns add'"
    ip netns del "${prefix}probe"
    trap 'down "$prefix"' EXIT
    trap 'exit 130' INT TERM
    MWMSTEST_HOSTS=$(up "$prefix" "$n" "$rate")
    export MWMSTEST_HOSTS
    echo "netns_hosts.sh: $n test hosts${rate:+ at $rate}: $MWMSTEST_HOSTS"
    status=0
    "$@" || status=$?
    exit $status
    ;;
  *) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2 ;;
esac
