#!/usr/bin/env bash
# Runs a bench tool (or train) across test hosts in network namespaces: H hosts with P ranks
# each, every rank a process started with TF_CONFIG inside its host's namespace (ranks in blocks
# per host), the hosts' links optionally shaped (tests/tools/netns_hosts.sh). Prints rank 0's
# output; every rank's log is in $OUT (default /tmp/mwms-netns).
#
# Usage (root): bench/run_netns.sh [-H hosts] [-P ranks_per_host] [-r rate] [-B bin_dir] \
#                 [-t tool] -- TOOL_ARGS...
#   bench/run_netns.sh -H 2 -P 2 -r 1gbit -- -b 4M -e 64M -f 4 -n 5 -w 1
#   MWMS_ALGO=ring bench/run_netns.sh -H 2 -P 2 -r 1gbit -- -b 16M -e 16M
#   bench/run_netns.sh -H 2 -r 1gbit -t train -- --epochs 1 --overlap_blocks 8
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
hosts=2 per=1 rate="" bin="$repo/build/bin" tool=all_reduce_perf
while getopts "H:P:r:B:t:h" opt; do
  case $opt in
    H) hosts=$OPTARG ;; P) per=$OPTARG ;; r) rate=$OPTARG ;; B) bin=$OPTARG ;; t) tool=$OPTARG ;;
    h) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) exit 2 ;;
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
export -f inner
args=(run "$hosts")
[ -z "$rate" ] || args+=("$rate")
exec bash "$repo/tests/tools/netns_hosts.sh" "${args[@]}" -- bash -c 'inner "$@"' inner "$@"
