#!/usr/bin/env bash
# `train` in parameter-server mode, launched exactly as TF 1's classic distributed job is: a
# ClusterSpec file with 1 ps and 2 workers and `--job_name=ps|worker --task_index=i` per process
# (asynchronous), the same cluster in TF_CONFIG with a chief (synchronous), and
# `mwmsrun -np 2 --ps 1 -- train --sync_replicas`, whose accuracy must equal the all-reduce
# strategy's on the same job (replicas_to_aggregate == workers: the same updates). The ps tasks
# exit 0 when the chief ends the job.
# Usage: train_ps_smoke.sh TRAIN_BINARY MWMSRUN_BINARY WORKDIR
set -euo pipefail
train=$1
mwmsrun=$2
work=$3
mkdir -p "$work"
steps=150
min_accuracy=0.70   # untrained: ~0.10; 150 steps of batch 64 reach ~0.75-0.80
export MWMS_CONNECT_TIMEOUT_SECONDS=30 MWMS_TIMEOUT_SECONDS=60
common="--epochs 1 --max_steps_per_epoch $steps --timeout_seconds 60"

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

accuracy() { grep -o '"test_accuracy": *[0-9.]*' "$1" | head -1 | grep -o '[0-9.]*$'; }
check() {  # FILE LABEL MODE
  local file=$1 label=$2 mode=$3 acc
  [ -s "$file" ] || { echo "FAIL $label: no metrics file $file"; exit 1; }
  grep -q "\"mode\": \"$mode\"" "$file" || { echo "FAIL $label: not $mode"; cat "$file"; exit 1; }
  acc=$(accuracy "$file")
  awk -v a="$acc" -v m="$min_accuracy" 'BEGIN { exit !(a >= m) }' ||
    { echo "FAIL $label: test_accuracy $acc < $min_accuracy"; exit 1; }
  echo "ok $label: $mode, test_accuracy $acc"
}

run_all() {  # LABEL CMD... (each one process, given as a single string)
  local label=$1; shift
  local pids=() i=0 rc=0
  for cmd in "$@"; do
    bash -c "$cmd" > "$work/$label.$i.log" 2>&1 & pids+=($!)
    i=$((i + 1))
  done
  for p in "${pids[@]}"; do wait "$p" || rc=$?; done
  if [ "$rc" != 0 ]; then
    echo "FAIL $label: exit $rc"; tail -n 20 "$work/$label".*.log; exit 1
  fi
}

# 1. TF 1's classic job: a ClusterSpec file, --job_name/--task_index, 1 ps + 2 workers, async.
free_port; p0=$port; free_port; p1=$port; free_port; p2=$port
echo "{\"ps\":[\"localhost:$p2\"],\"worker\":[\"localhost:$p0\",\"localhost:$p1\"]}" \
  > "$work/cluster.json"
flags="--cluster_spec $work/cluster.json"
run_all flags \
  "timeout 300 $train $common --job_name=worker --task_index=0 $flags --metrics_file $work/flags.json" \
  "timeout 300 $train $common --job_name=worker --task_index=1 $flags" \
  "timeout 300 $train $common --job_name=ps --task_index=0 $flags --metrics_file $work/flags.json"
check "$work/flags.json" tf1_flags ps-async
grep -q "parameter server" "$work/flags.2.log" || { echo "FAIL: the ps said nothing"; exit 1; }
[ -s "$work/flags.json.ps0.json" ] || { echo "FAIL: no ps metrics"; exit 1; }
grep -q '"staleness_histogram"' "$work/flags.json.ps0.json" ||
  { echo "FAIL: no staleness histogram"; cat "$work/flags.json.ps0.json"; exit 1; }
echo "ok ps metrics: staleness histogram"
# What a ps serves, not what a worker trains; every gradient it received accounted for.
! grep -q '"test_accuracy"\|"per_epoch"\|"images_per_sec"' "$work/flags.json.ps0.json" ||
  { echo "FAIL: training fields in the ps metrics"; cat "$work/flags.json.ps0.json"; exit 1; }
num() { grep -o "\"$1\": *[0-9]*" "$2" | grep -o '[0-9]*$'; }
m="$work/flags.json.ps0.json"
[ "$(num pushes "$m")" = $(( $(num applied "$m") + $(num dropped_stale "$m") + $(num after_end "$m") )) ] ||
  { echo "FAIL: pushes != applied + dropped_stale + after_end"; cat "$m"; exit 1; }
grep -q "train: worker 1 stopped at global step [0-9]* (" "$work/flags.1.log" ||
  { echo "FAIL: worker 1 did not say why it stopped"; cat "$work/flags.1.log"; exit 1; }
echo "ok ps metrics: $(num pushes "$m") received = applied + dropped + after the end; $(grep -o 'stopped at.*)' "$work/flags.1.log")"

# 2. TF_CONFIG with a chief, a worker and a ps, synchronous.
free_port; p0=$port; free_port; p1=$port; free_port; p2=$port
cluster="{\"chief\":[\"localhost:$p0\"],\"worker\":[\"localhost:$p1\"],\"ps\":[\"localhost:$p2\"]}"
tf() { echo "TF_CONFIG='{\"cluster\":$cluster,\"task\":{\"type\":\"$1\",\"index\":$2}}'"; }
run_all tf_config \
  "$(tf chief 0) timeout 300 $train $common --sync_replicas --metrics_file $work/tf.json" \
  "$(tf worker 0) timeout 300 $train $common --sync_replicas" \
  "$(tf ps 0) timeout 300 $train $common --sync_replicas"
check "$work/tf.json" tf_config ps-sync

# 3. mwmsrun --ps; synchronous with every worker aggregated = the all-reduce strategy's updates.
timeout 300 "$mwmsrun" -np 2 --ps 1 -- "$train" $common --sync_replicas \
  --metrics_file "$work/sync.json" > "$work/mwmsrun.log" 2>&1 ||
  { echo "FAIL mwmsrun --ps"; tail -n 20 "$work/mwmsrun.log"; exit 1; }
check "$work/sync.json" mwmsrun_ps ps-sync
timeout 300 "$mwmsrun" -np 2 -- "$train" $common --metrics_file "$work/allreduce.json" \
  > "$work/allreduce.log" 2>&1 || { echo "FAIL all-reduce"; tail -n 20 "$work/allreduce.log"; exit 1; }
a=$(accuracy "$work/sync.json"); b=$(accuracy "$work/allreduce.json")
awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.01) }' ||
  { echo "FAIL: ps-sync accuracy $a differs from all-reduce's $b"; exit 1; }
echo "ok ps-sync = all-reduce: test accuracy $a vs $b"

# 4. The session's checkpoints: the chief saves every 50 global steps and stops at step 100; the
# same directory without --resume is refused (no silent restart, no silent overwrite); with
# --resume every ps restores its shard file of step 100 and the job continues to step 150.
ck="$work/ckpt"
rm -rf "$ck"
timeout 300 "$mwmsrun" -np 2 --ps 1 -- "$train" $common --sync_replicas --checkpoint_dir "$ck" \
  --save_checkpoint_steps 50 --max_steps 100 > "$work/save.log" 2>&1 ||
  { echo "FAIL checkpointing run"; tail -n 20 "$work/save.log"; exit 1; }
for s in 0 50 100; do
  [ -s "$ck/model.ckpt-$s.manifest" ] && [ -s "$ck/model.ckpt-$s.ps-0-of-1" ] ||
    { echo "FAIL: no checkpoint of step $s"; ls -l "$ck"; exit 1; }
done
if timeout 300 "$mwmsrun" -np 2 --ps 1 -- "$train" $common --sync_replicas --checkpoint_dir "$ck" \
     --max_steps 150 > "$work/noresume.log" 2>&1; then
  echo "FAIL: a directory with checkpoints was used without --resume"; exit 1
fi
grep -q "pass --resume" "$work/noresume.log" ||
  { echo "FAIL: the refusal does not say what to do"; tail -n 20 "$work/noresume.log"; exit 1; }
timeout 300 "$mwmsrun" -np 2 --ps 1 -- "$train" $common --sync_replicas --checkpoint_dir "$ck" \
  --resume --max_steps 150 --metrics_file "$work/resume.json" > "$work/resume.log" 2>&1 ||
  { echo "FAIL resumed run"; tail -n 20 "$work/resume.log"; exit 1; }
grep -q "restored .*model.ckpt-100.manifest (global step 100)" "$work/resume.log" ||
  { echo "FAIL: the resumed run did not restore step 100"; tail -n 20 "$work/resume.log"; exit 1; }
grep -q '"global_step": 150' "$work/resume.json" ||
  { echo "FAIL: the resumed run did not end at step 150"; cat "$work/resume.json"; exit 1; }
echo "ok checkpoints: saved at 0, 50, 100; refused without --resume; resumed 100 -> 150"

# 5. A ps killed mid-training and started again (as a cluster manager restarts a task): with
# --max_recoveries 1 the chief and the worker reconnect the job, the chief restores the newest
# checkpoint, and the job finishes its steps.
free_port; p0=$port; free_port; p1=$port; free_port; p2=$port
cluster="{\"chief\":[\"localhost:$p0\"],\"worker\":[\"localhost:$p1\"],\"ps\":[\"localhost:$p2\"]}"
ck="$work/ckpt_recovery"
rm -rf "$ck"
rec="--epochs 1 --max_steps 900 --sync_replicas --checkpoint_dir $ck --save_checkpoint_steps 50 \
  --max_recoveries 1 --timeout_seconds 20"
bash -c "$(tf chief 0) timeout 300 $train $rec --metrics_file $work/recovery.json" \
  > "$work/recovery.0.log" 2>&1 & chief=$!
bash -c "$(tf worker 0) timeout 300 $train $rec" > "$work/recovery.1.log" 2>&1 & worker=$!
bash -c "$(tf ps 0) exec $train $rec" > "$work/recovery.2.log" 2>&1 & ps=$!
for _ in $(seq 1 3000); do
  [ -s "$ck/model.ckpt-100.manifest" ] && break
  kill -0 "$ps" 2>/dev/null || break
  sleep 0.02
done
kill -9 "$ps" 2>/dev/null || { echo "FAIL: the ps exited before it could be killed"; exit 1; }
wait "$ps" 2>/dev/null || true
bash -c "$(tf ps 0) timeout 300 $train $rec" > "$work/recovery.3.log" 2>&1 & ps=$!
rc=0
for p in "$chief" "$worker" "$ps"; do wait "$p" || rc=$?; done
[ "$rc" = 0 ] || { echo "FAIL recovery: exit $rc"; tail -n 20 "$work"/recovery.*.log; exit 1; }
grep -q "recovered (1 of 1)" "$work/recovery.0.log" ||
  { echo "FAIL: the chief did not recover"; tail -n 20 "$work/recovery.0.log"; exit 1; }
grep -q '"recoveries": 1' "$work/recovery.json" && grep -q '"global_step": 900' "$work/recovery.json" ||
  { echo "FAIL: recovery metrics"; cat "$work/recovery.json"; exit 1; }
check "$work/recovery.json" recovery ps-sync
echo "train ps smoke: TF1 flags (async), TF_CONFIG (sync), mwmsrun --ps, checkpoints and resume, recovery passed"
