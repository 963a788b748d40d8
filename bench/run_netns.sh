#!/usr/bin/env bash
# Runs a bench tool (or train) across test hosts in network namespaces: H hosts with P ranks
# each, every rank a process started with TF_CONFIG inside its host's namespace (ranks in blocks
# per host), the hosts' links optionally shaped (tests/tools/netns_hosts.sh). Prints rank 0's
# output; every rank's log is in $OUT (default /tmp/mwms-netns).
#
# With -m the ranks are started by Open MPI's mpirun instead (run inside the first host's
# namespace; bench/netns_rsh.sh starts its daemons in the other hosts' namespaces), so that
# --compare mpi times Open MPI's TCP transport (btl tcp,self on eth0, the veth) on the same links
# and in the same run; libmwms bootstraps from mpirun's environment and uses TCP between hosts
# (MWMS_SOCKET_IFNAME=eth0). Open MPI runs at its best (glibc keeps freed memory). MWMS_*
# variables set by the caller are passed to every rank.
#
# Usage (root): bench/run_netns.sh [-H hosts] [-P ranks_per_host] [-r rate] [-B bin_dir] \
#                 [-t tool] [-m] -- TOOL_ARGS...        (-h, --help: this text)
#   bench/run_netns.sh -H 2 -P 2 -r 1gbit -- -b 4M -e 64M -f 4 -n 5 -w 1
#   MWMS_ALGO=ring bench/run_netns.sh -H 2 -P 2 -r 1gbit -- -b 16M -e 16M
#   bench/run_netns.sh -H 2 -r 1gbit -t train -- --epochs 1 --overlap_blocks 8
#   bench/run_netns.sh -H 4 -r 1gbit -m -- -b 1M -e 256M -f 4 --compare mpi,gloo
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
hosts=2 per=1 rate="" bin="$repo/build/bin" tool=all_reduce_perf launcher=inner
# --help/-h: the usage above, status 0; an unknown option or a missing value: the usage on stderr,
# status 2.
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
bad_usage() { echo "run_netns.sh: $1" >&2; usage >&2; exit 2; }
while getopts ":H:P:r:B:t:mh-:" opt; do
  case $opt in
    H) hosts=$OPTARG ;; P) per=$OPTARG ;; r) rate=$OPTARG ;; B) bin=$OPTARG ;; t) tool=$OPTARG ;;
    m) launcher=inner_mpirun ;;
    h) usage; exit 0 ;;
    -) [ "$OPTARG" = help ] || bad_usage "unknown option --$OPTARG"; usage; exit 0 ;;
    :) bad_usage "option -$OPTARG needs a value" ;;
    *) bad_usage "unknown option -$OPTARG" ;;
  esac
done
shift $((OPTIND - 1))
[ "${1:-}" != "--" ] || shift
export MWMSNETNS_PER=$per MWMSNETNS_BIN=$bin/$tool OUT=${OUT:-/tmp/mwms-netns}
mkdir -p "$OUT"
inner() {
  IFS=, read -ra H <<< "$MWMSTEST_HOSTS"
  local n=$(( ${#H[@]} * MWMSNETNS_PER )) workers="" r h pids=()
  for (( r = 0; r < n; r++ )); do
    h=$(( r / MWMSNETNS_PER ))
    workers+="${workers:+,}\"${H[$h]#*=}:$((29900 + r))\""
  done
  for (( r = 0; r < n; r++ )); do
    h=$(( r / MWMSNETNS_PER ))
    TF_CONFIG="{\"cluster\":{\"worker\":[$workers]},\"task\":{\"type\":\"worker\",\"index\":$r}}" \
      ip netns exec "${H[$h]%%=*}" "$MWMSNETNS_BIN" "$@" > "$OUT/rank$r.log" 2>&1 &
    pids+=($!)
  done
  local status=0
  for p in "${pids[@]}"; do wait "$p" || status=$?; done
  cat "$OUT/rank0.log"
  return $status
}
# Open MPI across the namespaces: mpirun in host 0's namespace, one daemon per other host through
# the rsh agent, Open MPI's TCP BTL and out-of-band channel on the veth only.
inner_mpirun() {
  IFS=, read -ra H <<< "$MWMSTEST_HOSTS"
  local n=$(( ${#H[@]} * MWMSNETNS_PER )) list="" h env=() v status=0
  for h in "${H[@]}"; do list+="${list:+,}${h#*=}:$MWMSNETNS_PER"; done
  for v in $(env | grep -o '^MWMS_[A-Z0-9_]*' || true); do env+=(-x "$v"); done
  ip netns exec "${H[0]%%=*}" mpirun --allow-run-as-root -np "$n" --host "$list" \
    --mca plm_rsh_agent "$MWMSNETNS_RSH" --mca plm_rsh_no_tree_spawn 1 \
    --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0 \
    -x MALLOC_MMAP_MAX_=0 -x MALLOC_TRIM_THRESHOLD_=-1 -x MWMS_SOCKET_IFNAME=eth0 \
    -x MWMS_TRANSPORT="${MWMS_TRANSPORT:-tcp}" "${env[@]}" \
    "$MWMSNETNS_BIN" "$@" > "$OUT/rank0.log" 2>&1 || status=$?
  cat "$OUT/rank0.log"
  return $status
}
export -f inner inner_mpirun
export MWMSNETNS_RSH=$here/netns_rsh.sh
args=(run "$hosts")
[ -z "$rate" ] || args+=("$rate")
exec bash "$repo/tests/tools/netns_hosts.sh" "${args[@]}" -- bash -c "$launcher \"\$@\"" inner "$@"
