#!/usr/bin/env bash
# Smoke run of `train --model cnn` and of local replicas, a few hundred images each: one process
# with 1 local replica, then 2 workers (mwmsrun) x 2 local replicas on the same global batches.
# Both must learn (test accuracy well above the untrained 0.10) and, being the same training on
# the same global batches (Note [replica models]), report the same loss up to float summation
# order. Without a GPU, `--device gpu` must fail naming the reason.
# Usage: train_cnn_smoke.sh TRAIN_BINARY MWMSRUN_BINARY WORKDIR
set -euo pipefail
train=$1
mwmsrun=$2
work=$3
mkdir -p "$work"
export MWMS_CONNECT_TIMEOUT_SECONDS=30 MWMS_TIMEOUT_SECONDS=60
common="--model cnn --epochs 1 --max_steps_per_epoch 12 --batch_size 32 --timeout_seconds 60"
min_accuracy=0.35   # untrained: ~0.10; these 384 images reach ~0.5-0.6

field() {  # FILE NAME: a number from the metrics file
  grep -o "\"$2\": *[0-9.e+-]*" "$1" | head -1 | sed 's/.*: *//'
}

timeout 300 "$train" $common --metrics_file "$work/k1.json" > "$work/k1.log" 2>&1 ||
  { echo "FAIL one replica"; cat "$work/k1.log"; exit 1; }
timeout 300 "$mwmsrun" -np 2 "$train" $common --local_replicas 2 --metrics_file "$work/k2.json" \
  > "$work/k2.log" 2>&1 || { echo "FAIL 2 workers x 2 local replicas"; cat "$work/k2.log"; exit 1; }

for run in k1 k2; do
  acc=$(field "$work/$run.json" test_accuracy)
  awk -v a="$acc" -v m="$min_accuracy" 'BEGIN { exit !(a >= m) }' ||
    { echo "FAIL $run: test_accuracy $acc < $min_accuracy"; exit 1; }
  echo "ok $run: test_accuracy $acc"
done
[ "$(field "$work/k2.json" num_replicas_in_sync)" = 4 ] && [ "$(field "$work/k2.json" local_replicas)" = 2 ] ||
  { echo "FAIL: k2 metrics do not say 4 replicas in sync, 2 local"; cat "$work/k2.json"; exit 1; }
l1=$(field "$work/k1.json" final_train_loss)
l2=$(field "$work/k2.json" final_train_loss)
awk -v a="$l1" -v b="$l2" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-3 * a) }' ||
  { echo "FAIL: loss $l2 (2 workers x 2 replicas) differs from $l1 (one replica)"; exit 1; }
echo "ok same loss: $l1 (1 replica) vs $l2 (2 x 2 replicas)"

if nvidia-smi -L > /dev/null 2>&1; then
  echo "skip --device gpu without a device: this machine has one (gpu:train-model tests it)"
elif "$train" --device gpu --epochs 0 > "$work/gpu.log" 2>&1; then
  echo "FAIL: --device gpu must fail without a device"; exit 1
else
  grep -q -- "--device gpu: " "$work/gpu.log" || { echo "FAIL gpu message"; cat "$work/gpu.log"; exit 1; }
  echo "ok --device gpu: $(cat "$work/gpu.log")"
fi
