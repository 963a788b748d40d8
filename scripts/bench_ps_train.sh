#!/usr/bin/env bash
# The comparison of docs/parameter_server.md, "Measured": `train` for 1 epoch in all-reduce,
# ps-async and ps-sync mode (1 ps + 2 workers), interleaved, RUNS times each; prints each run's
# images/s and test accuracy, then the median images/s per mode and its ratio to all-reduce.
# Usage: scripts/bench_ps_train.sh [RUNS] [BUILD_DIR]   (defaults: 3, build)
set -euo pipefail
runs=${1:-3}
build=${2:-build}
if ! [[ $runs =~ ^[1-9][0-9]*$ ]] || [ ! -x "$build/bin/train" ]; then
  echo "Usage: scripts/bench_ps_train.sh [RUNS] [BUILD_DIR] (RUNS >= 1; BUILD_DIR/bin/train built)" >&2
  exit 2
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
declare -A args=([all-reduce]="-np 2 --" [ps-async]="-np 2 --ps 1 --" [ps-sync]="-np 2 --ps 1 --")
declare -A extra=([all-reduce]="" [ps-async]="" [ps-sync]="--sync_replicas")
modes=(all-reduce ps-async ps-sync)
for i in $(seq 1 "$runs"); do
  for m in "${modes[@]}"; do
    # shellcheck disable=SC2086
    "$build/bin/mwmsrun" ${args[$m]} "$build/bin/train" --epochs 1 ${extra[$m]} \
      --metrics_file "$out/$m.$i.json" > "$out/$m.$i.log" 2>&1 ||
      { echo "bench_ps_train.sh: $m run $i failed:"; tail -n 5 "$out/$m.$i.log"; exit 1; }
  done
done
python3 - "$out" "$runs" <<'PY'
import json, statistics, sys
out, runs = sys.argv[1], int(sys.argv[2])
med = {}
for m in ("all-reduce", "ps-async", "ps-sync"):
    rows = [json.load(open(f"{out}/{m}.{i}.json")) for i in range(1, runs + 1)]
    ips = [r["images_per_sec"] for r in rows]
    med[m] = statistics.median(ips)
    print(f"{m:10s} images/s " + " / ".join(f"{x:,.0f}" for x in ips) +
          f"  median {med[m]:,.0f}  accuracy " + " / ".join(f"{r['test_accuracy']:.4f}" for r in rows))
for m in ("ps-async", "ps-sync"):
    print(f"{m}: {med[m] / med['all-reduce']:.2f}x all-reduce")
PY
