#!/usr/bin/env bash
# The comparison of docs/parameter_server.md, "Measured": `train` for 1 epoch in all-reduce,
# ps-async and ps-sync mode (1 ps + 2 workers), interleaved, RUNS times each; prints each run's
# images/s and test accuracy, then the median images/s per mode and its ratio to all-reduce.
# With TF_PYTHON set to a Python that has tensorflow-cpu (a venv outside the repository, see
# scripts/tf_ps_baseline.py), every round also runs TensorFlow's own ps training on the same job
# (TF 1 async, TF 1 SyncReplicasOptimizer, TF 2 ParameterServerStrategy + ClusterCoordinator) and
# the medians are compared in the same run: ps-async / TF async, ps-sync / TF sync.
# Usage: [TF_PYTHON=/tmp/tfvenv/bin/python3] scripts/bench_ps_train.sh [RUNS] [BUILD_DIR]
#        (defaults: 3, build)
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
tf_modes=()
if [ -n "${TF_PYTHON:-}" ]; then
  tf_modes=(async sync pss)
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
fi
for i in $(seq 1 "$runs"); do
  for m in "${tf_modes[@]}"; do
    TF_CPP_MIN_LOG_LEVEL=2 "$TF_PYTHON" "$here/tf_ps_baseline.py" --mode "$m" \
      --json "$out/tf-$m.$i.json" > "$out/tf-$m.$i.log" 2>&1 ||
      { echo "bench_ps_train.sh: TF $m run $i failed:"; tail -n 5 "$out/tf-$m.$i.log"; exit 1; }
  done
  for m in "${modes[@]}"; do
    # shellcheck disable=SC2086
    "$build/bin/mwmsrun" ${args[$m]} "$build/bin/train" --epochs 1 ${extra[$m]} \
      --metrics_file "$out/$m.$i.json" > "$out/$m.$i.log" 2>&1 ||
      { echo "bench_ps_train.sh: $m run $i failed:"; tail -n 5 "$out/$m.$i.log"; exit 1; }
  done
done
python3 - "$out" "$runs" "${#tf_modes[@]}" <<'PY'
import json, statistics, sys
out, runs, with_tf = sys.argv[1], int(sys.argv[2]), sys.argv[3] != "0"
med = {}
modes = ["all-reduce", "ps-async", "ps-sync"] + (["tf-async", "tf-sync", "tf-pss"] if with_tf else [])
for m in modes:
    rows = [json.load(open(f"{out}/{m}.{i}.json")) for i in range(1, runs + 1)]
    ips = [r["images_per_sec"] for r in rows]
    med[m] = statistics.median(ips)
    print(f"{m:10s} images/s " + " / ".join(f"{x:,.0f}" for x in ips) +
          f"  median {med[m]:,.0f}  accuracy " + " / ".join(f"{r['test_accuracy']:.4f}" for r in rows))
for m in ("ps-async", "ps-sync"):
    line = f"{m}: {med[m] / med['all-reduce']:.2f}x all-reduce"
    if with_tf:
        tf = "tf-" + m[3:]
        line += f", {med[m] / med[tf]:.2f}x TensorFlow's {m[3:]} ({tf}) in the same run"
    print(line)
PY
