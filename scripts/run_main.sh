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

# mwmsrun starts the 2 worker processes with one TF_CONFIG each (free loopback ports), exactly as
# a multi-host job would be wired, prefixes their lines with the rank, and ends the other worker
# with the first failure's status if one fails.
rm -f "$metrics"
echo "run_main.sh: build/bin/mwmsrun -np 2 -- build/bin/train --epochs $epochs (2 workers, TF_CONFIG)"
status=0
build/bin/mwmsrun -np 2 -- build/bin/train --epochs "$epochs" --metrics_file "$metrics" \
  2>&1 | tee build/train.log || status=$?
if [[ $status -ne 0 ]]; then
  echo "run_main.sh: a worker failed (mwmsrun exit status $status); the log is build/train.log" >&2
  exit 1
fi

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
