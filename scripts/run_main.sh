#!/usr/bin/env bash
# The main job: install dependencies, build, then train the Fashion-MNIST MLP with libmwms's
# MultiWorkerMirroredStrategy as 2 worker processes on this machine, wired with TF_CONFIG exactly
# as a multi-host job would be (one TF_CONFIG per process, loopback addresses). Prints the final
# test accuracy and fails when it is below 0.85 or when either worker fails.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

epochs=3
min_accuracy=0.85
metrics=build/metrics.json

bash scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j2

# A TCP port nobody listens on (IPv4 or IPv6), in 20000-31999: below Linux's ephemeral range
# (32768-60999), so an outgoing connection cannot take it between this check and the bind.
# /proc/net/tcp* lists listeners with state 0A and "address:port" in hex.
listening_ports() {
  local _sl local_address _remote state _rest
  while read -r _sl local_address _remote state _rest; do
    [[ "$state" == "0A" ]] && echo $((16#${local_address##*:}))
  done < <(cat /proc/net/tcp /proc/net/tcp6 2>/dev/null)
  return 0
}
free_port() {
  local taken port
  taken=$(listening_ports | sort -u)
  for _ in $(seq 1 100); do
    port=$((20000 + RANDOM % 12000))
    if ! grep -qx "$port" <<<"$taken" && [[ "$port" != "${1:-}" ]]; then
      echo "$port"
      return 0
    fi
  done
  echo "run_main.sh: no free port found" >&2
  return 1
}
port0=$(free_port)
port1=$(free_port "$port0")
cluster="{\"worker\": [\"127.0.0.1:$port0\", \"127.0.0.1:$port1\"]}"

rm -f "$metrics"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT INT TERM

echo "run_main.sh: 2 workers on 127.0.0.1:$port0 and 127.0.0.1:$port1, $epochs epochs"
for index in 0 1; do
  tf_config="{\"cluster\": $cluster, \"task\": {\"type\": \"worker\", \"index\": $index}}"
  # Worker 0 is the leader: it prints the epochs and writes the metrics; worker 1 logs to a file.
  if [[ $index -eq 0 ]]; then
    TF_CONFIG="$tf_config" build/bin/train --epochs "$epochs" --metrics_file "$metrics" \
      > >(tee build/train_worker0.log) 2>&1 &
  else
    TF_CONFIG="$tf_config" build/bin/train --epochs "$epochs" --metrics_file "$metrics" \
      > build/train_worker1.log 2>&1 &
  fi
  pids+=($!)
done

# Wait for both; the first failure stops the other instead of leaving it waiting for its peer.
declare -A status=()
while [[ ${#status[@]} -lt 2 ]]; do
  for index in 0 1; do
    [[ -n "${status[$index]:-}" ]] && continue
    kill -0 "${pids[$index]}" 2>/dev/null && continue
    rc=0
    wait "${pids[$index]}" || rc=$?
    status[$index]=$rc
    if [[ $rc -ne 0 ]]; then
      echo "run_main.sh: worker $index exited with status $rc; stopping the other worker" >&2
      cleanup
      echo "--- tail of build/train_worker$((1 - index)).log and build/train_worker$index.log:" >&2
      tail -n 20 "build/train_worker$((1 - index)).log" "build/train_worker$index.log" >&2 || true
      exit 1
    fi
  done
  sleep 1
done
trap - EXIT INT TERM

# Top-level keys of the metrics file are indented by two spaces (nlohmann dump(2)); the per-epoch
# copies of test_accuracy are deeper, so this picks the final value without a JSON tool.
accuracy=$(sed -n 's/^  "test_accuracy": \([-0-9.eE+]*\),\{0,1\}$/\1/p' "$metrics")
if [[ -z "$accuracy" ]]; then
  echo "run_main.sh: no test_accuracy in $metrics" >&2
  exit 1
fi
echo "final test accuracy: $accuracy (metrics in $metrics)"
if awk -v a="$accuracy" -v m="$min_accuracy" 'BEGIN { exit !(a < m) }'; then
  echo "run_main.sh: accuracy $accuracy is below $min_accuracy" >&2
  exit 1
fi
