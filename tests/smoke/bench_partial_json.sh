#!/usr/bin/env bash
# A size that fails mid-sweep keeps the rows already measured in --json (Note [partial json] in
# bench/common/size_sweep.cc): two TF_CONFIG ranks of all_reduce_perf where rank 1's sweep stops at
# 32 B (-e 32) and rank 0's goes on to 64 KiB, so rank 1 leaves after three sizes and rank 0's
# fourth size (64 B) fails naming it. Rank 0 must exit 2 and its JSON hold the three rows, then a
# failure record for 64 B with the error, then a summary with "complete": false.
# Usage: bench_partial_json.sh ALL_REDUCE_PERF WORKDIR
set -euo pipefail
perf=$1
work=$2
mkdir -p "$work"
export MWMS_CONNECT_TIMEOUT_SECONDS=30 MWMS_TIMEOUT_SECONDS=30 TF_CONFIG=
json=$work/partial.json

# Ports below the kernel's ephemeral range, as in bench_smoke.sh; a port taken between the probe
# and the bind is retried.
ephemeral_low=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
free_port() {
  local p
  while :; do
    p=$(( (RANDOM % (ephemeral_low - 10000)) + 10000 ))
    [ "$p" != "${1:-}" ] || continue
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
  done
}
for attempt in 1 2 3; do
  rm -f "$json"
  p0=$(free_port); p1=$(free_port "$p0")
  cluster="{\"worker\":[\"127.0.0.1:$p0\",\"127.0.0.1:$p1\"]}"
  TF_CONFIG="{\"cluster\":$cluster,\"task\":{\"type\":\"worker\",\"index\":1}}" \
    timeout 120 "$perf" -b 8 -e 32 -n 2 -w 1 > "$work/rank1.log" 2>&1 &
  pid=$!
  status=0
  TF_CONFIG="{\"cluster\":$cluster,\"task\":{\"type\":\"worker\",\"index\":0}}" \
    timeout 120 "$perf" -b 8 -e 64K -n 2 -w 1 --json "$json" > "$work/rank0.log" 2>&1 || status=$?
  wait "$pid" || true
  grep -q "already in use" "$work/rank0.log" "$work/rank1.log" || break
  echo "port taken, retrying"
done
fail() { echo "FAIL: $1"; cat "$work/rank0.log" "$work/rank1.log"; [ ! -f "$json" ] || cat "$json"; exit 1; }
[ "$status" -eq 2 ] || fail "rank 0 exited $status, not 2"
[ -f "$json" ] || fail "no --json file after the failed size"
python3 - "$json" <<'EOF' || fail "JSON contents"
import json, sys
records = json.load(open(sys.argv[1]))
kinds = [r["record"] for r in records]
assert kinds == ["row", "row", "row", "failure", "summary"], kinds
assert [r["size"] for r in records[:3]] == [8, 16, 32], records[:3]
assert all(r["wrong"] == 0 for r in records[:3]), records[:3]
failure, summary = records[3], records[4]
assert failure["size"] == 64 and failure["count"] == 16, failure
assert failure["collective"] == "all_reduce" and failure["ranks"] == 2, failure
assert "rank 1" in failure["error"], failure["error"]
assert summary["complete"] is False and summary["ok"] is False, summary
assert summary["rows"] == 3, summary
EOF
grep -q "^all_reduce_perf: .*rank 1" "$work/rank0.log" || fail "rank 0 did not report the error"
echo "ok: 3 rows, the failed 64 B size and its error kept in --json; exit status 2"
