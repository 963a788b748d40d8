#!/usr/bin/env bash
# Smoke run of `train` the three ways a user launches it: mpirun -np 2, two processes with
# TF_CONFIG (workers only, then chief + worker), and TF1-style flags. Each run is a short epoch;
# the leader's metrics file must report 2 replicas and a test accuracy that only training reaches.
# Usage: train_smoke.sh TRAIN_BINARY WORKDIR
set -euo pipefail
train=$1
work=$2
mkdir -p "$work"
steps=150
min_accuracy=0.70   # untrained: ~0.10; 150 steps of batch 64 reach ~0.75-0.80

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export MWMS_CONNECT_TIMEOUT_SECONDS=30 MWMS_TIMEOUT_SECONDS=60

check_metrics() {  # FILE LABEL
  local file=$1 label=$2
  [ -s "$file" ] || { echo "FAIL $label: no metrics file $file"; exit 1; }
  local replicas acc
  replicas=$(grep -o '"num_replicas_in_sync": *[0-9]*' "$file" | grep -o '[0-9]*$')
  acc=$(grep -o '"test_accuracy": *[0-9.]*' "$file" | head -1 | grep -o '[0-9.]*$')
  [ "$replicas" = 2 ] || { echo "FAIL $label: num_replicas_in_sync $replicas"; exit 1; }
  awk -v a="$acc" -v m="$min_accuracy" 'BEGIN { exit !(a >= m) }' ||
    { echo "FAIL $label: test_accuracy $acc < $min_accuracy"; exit 1; }
  echo "ok $label: test_accuracy $acc, 2 replicas"
  echo "$acc"  > "$file.acc"
}

# Ports below the kernel's ephemeral range (ip_local_port_range), where no outgoing connection of
# ours can take the port between choosing it and binding it; never the same port twice in a run.
ephemeral_low=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
used_ports=" "
free_port() {  # sets $port to a port nothing listens on right now (no subshell: keeps used_ports)
  local p
  while :; do
    p=$(( (RANDOM % (ephemeral_low - 10000)) + 10000 ))
    case "$used_ports" in *" $p "*) continue ;; esac
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null && continue
    used_ports="$used_ports$p "
    port=$p
    return
  done
}

run_pair() {  # LABEL CMD0... -- CMD1... (each given as a single string)
  local label=$1 cmd0=$2 cmd1=$3
  bash -c "$cmd0" > "$work/$label.0.log" 2>&1 & local p0=$!
  bash -c "$cmd1" > "$work/$label.1.log" 2>&1 & local p1=$!
  local rc=0
  wait "$p0" || rc=$?
  wait "$p1" || rc=$?
  if [ "$rc" != 0 ]; then
    echo "FAIL $label: exit $rc"; cat "$work/$label.0.log" "$work/$label.1.log"; exit 1
  fi
}

common="--epochs 1 --max_steps_per_epoch $steps --timeout_seconds 60"

# 1. mpirun -np 2 (the leader also writes a checkpoint for the evaluator below)
rm -rf "$work/ckpt"
timeout 300 mpirun --oversubscribe -np 2 "$train" $common --metrics_file "$work/mpi.json" \
  --checkpoint_dir "$work/ckpt" \
  > "$work/mpi.log" 2>&1 || { echo "FAIL mpirun"; cat "$work/mpi.log"; exit 1; }
check_metrics "$work/mpi.json" mpirun

# 2. two workers with TF_CONFIG
free_port; p0=$port; free_port; p1=$port
cluster="{\"worker\":[\"localhost:$p0\",\"localhost:$p1\"]}"
run_pair tf_config \
  "TF_CONFIG='{\"cluster\":$cluster,\"task\":{\"type\":\"worker\",\"index\":0}}' timeout 300 $train $common --metrics_file $work/tf.json" \
  "TF_CONFIG='{\"cluster\":$cluster,\"task\":{\"type\":\"worker\",\"index\":1}}' timeout 300 $train $common"
check_metrics "$work/tf.json" tf_config

# 3. chief + worker with TF_CONFIG (the chief is rank 0 and writes the metrics)
free_port; p0=$port; free_port; p1=$port
cluster="{\"chief\":[\"localhost:$p0\"],\"worker\":[\"localhost:$p1\"]}"
run_pair chief \
  "TF_CONFIG='{\"cluster\":$cluster,\"task\":{\"type\":\"chief\",\"index\":0},\"environment\":\"cloud\"}' timeout 300 $train $common --metrics_file $work/chief.json" \
  "TF_CONFIG='{\"cluster\":$cluster,\"task\":{\"type\":\"worker\",\"index\":0},\"environment\":\"cloud\"}' timeout 300 $train $common"
check_metrics "$work/chief.json" chief_worker

# 4. TF1-style flags
free_port; p0=$port; free_port; p1=$port
echo "{\"worker\":[\"localhost:$p0\",\"localhost:$p1\"]}" > "$work/cluster.json"
run_pair flags \
  "timeout 300 $train $common --job_name worker --task_index 0 --cluster_spec $work/cluster.json --metrics_file $work/flags.json" \
  "timeout 300 $train $common --job_name worker --task_index 1 --cluster_spec $work/cluster.json"
check_metrics "$work/flags.json" flags

# 5. An evaluator task never joins the ring: it evaluates the chief's checkpoint alone.
eval_config='{"cluster":{"chief":["localhost:1"],"worker":["localhost:2"],"evaluator":["localhost:3"]},"task":{"type":"evaluator","index":0}}'
TF_CONFIG=$eval_config timeout 120 "$train" --checkpoint_dir "$work/ckpt" > "$work/eval.log" 2>&1 ||
  { echo "FAIL evaluator"; cat "$work/eval.log"; exit 1; }
grep -q "test accuracy $(cat "$work/mpi.json.acc")" "$work/eval.log" ||
  { echo "FAIL evaluator: accuracy differs from the chief's"; cat "$work/eval.log"; exit 1; }
echo "ok evaluator: evaluated the chief's checkpoint outside the ring"
# A ps task in the cluster makes it a parameter-server job: tests/smoke/train_ps_smoke.sh.

# Same data, same seed, same global batch: every launch mode must reach the same accuracy.
first=$(cat "$work/mpi.json.acc")
for f in tf chief flags; do
  other=$(cat "$work/$f.json.acc")
  awk -v a="$first" -v b="$other" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.01) }' ||
    { echo "FAIL: accuracy $other ($f) differs from $first (mpirun)"; exit 1; }
done
# 6. One worker x 2 local replicas, the gradient all-reduce overlapped with backprop (each bucket
# reduced across the replicas first): the same train loss as the blocking step, to the last digit.
timeout 300 "$train" $common --local_replicas 2 --metrics_file "$work/k2.json" \
  > "$work/k2.log" 2>&1 || { echo "FAIL k2"; cat "$work/k2.log"; exit 1; }
check_metrics "$work/k2.json" local_replicas_2
timeout 300 "$train" $common --local_replicas 2 --overlap_blocks 4 --metrics_file "$work/k2o.json" \
  > "$work/k2o.log" 2>&1 || { echo "FAIL k2 overlap"; cat "$work/k2o.log"; exit 1; }
check_metrics "$work/k2o.json" local_replicas_2_overlap
loss() { grep -o '"train_loss": *[0-9.e-]*' "$1" | head -1 | grep -o '[0-9.e-]*$'; }
[ "$(loss "$work/k2.json")" = "$(loss "$work/k2o.json")" ] ||
  { echo "FAIL: overlapped K = 2 train loss $(loss "$work/k2o.json") != $(loss "$work/k2.json")"; exit 1; }
echo "ok overlap with 2 local replicas: the blocking step's train loss"
# 7. 3 local replicas of a global batch of 64: shards of 22/21/21 rows, said once on the chief.
timeout 300 "$train" --epochs 1 --max_steps_per_epoch 5 --timeout_seconds 60 --local_replicas 3 \
  > "$work/k3.log" 2>&1 || { echo "FAIL k3"; cat "$work/k3.log"; exit 1; }
[ "$(grep -c "does not divide by the 3 replicas in sync: 1 replica(s) take 22 rows, 2 take 21" \
     "$work/k3.log")" = 1 ] || { echo "FAIL: no single uneven-shard warning:"; cat "$work/k3.log"; exit 1; }
! grep -q "does not divide" "$work/k2.log" || { echo "FAIL: a warning for an even split"; exit 1; }
echo "ok 3 local replicas of 64 rows: one warning naming the 22/21/21 split"

echo "train smoke: 4 launch modes, evaluator and overlapped local replicas passed"
