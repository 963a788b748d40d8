#!/usr/bin/env bash
# `train --help` shows each option's default (the values of TrainConfig and train_main.cc's Flags):
# CLI11 prints "--name TYPE=DEFAULT"; options whose default is unset say so in their description.
# Usage: train_help.sh TRAIN
set -euo pipefail
help=$("$1" --help)
for expect in "--epochs .*=3" "--batch_size .*=64" "--lr .*=0.01" "--seed .*=42" \
              "--data_dir .*=/usr/share/datasets/fashion-mnist" "--max_steps_per_epoch .*=0" \
              "--task_index .*=0" "--bytes_per_pack .*=0" "--timeout_seconds .*=0" \
              "--checkpoint_dir .*default: none" "--metrics_file .*default: none" \
              "--resume .*default: off" "--job_name .*default: none" "--cluster_spec .*default: none" \
              "--model .*=mlp" "--local_replicas .*=1" "--device .*=auto"; do
  grep -Eq -- "^ +$expect([ ,)]|$)" <<<"$help" ||
    { echo "FAIL: no '$expect' in train --help:"; echo "$help"; exit 1; }
done
echo "ok train --help shows the defaults"
# A bad command line exits 2 (as mwmsrun, the benches and mwms-doctor do), with the reason.
for bad in "--no_such_flag" "--epochs x" "--lr 0" "--job_name worker" \
           "--save_checkpoint_steps 5" "--resume" "--model cnn --overlap_blocks 2"; do
  rc=0
  # shellcheck disable=SC2086
  out=$("$1" $bad 2>&1) || rc=$?
  [ "$rc" -eq 2 ] || { echo "FAIL: train $bad exited $rc, expected 2: $out"; exit 1; }
  grep -q "train: error:" <<<"$out" || { echo "FAIL: train $bad said no error: $out"; exit 1; }
done
echo "ok train exits 2 on a bad command line"
