#!/usr/bin/env bash
# smoke:gpu-check-budget — scripts/gpu_check.sh's own mechanics, checked without a GPU: with a
# budget of 0 s no step may run, so every step must be reported "== FAIL NAME (budget ...)" and the
# script must go on to the next one, end with its verdict line and exit 1; without BUILD_DIR the
# build directory it names must lie outside LOG_DIR (a GPU session copies LOG_DIR back, and a
# CUDA build in it would be too big to come back) and LOG_DIR must hold only logs.
# Usage: gpu_check_budget.sh GPU_CHECK_SH BUILD_DIR WORK_DIR
set -euo pipefail
script=$1 build=$2 work=$3
rm -rf "$work"
mkdir -p "$work/fmnist"
work=$(cd "$work" && pwd)
fail() { echo "FAIL: $*"; exit 1; }

# Without BUILD_DIR: the configure step is refused, and nothing can follow it.
rc=0
GPU_CHECK_BUDGET_SECONDS=0 "$script" "$work/logs1" > "$work/out1" 2>&1 || rc=$?
cat "$work/out1"
[[ $rc -eq 1 ]] || fail "exit status $rc without BUILD_DIR, expected 1"
grep -q '^== FAIL configure (budget' "$work/out1" || fail "configure not refused by the budget"
tail -n 1 "$work/out1" | grep -q '^gpu_check: FAILED (configure' ||
  fail "no verdict line after the configure step failed"
dir=$(sed -n 's/^gpu_check: .*, build directory //p' "$work/out1")
[[ -n $dir && $dir != "$work/logs1" && $dir != "$work/logs1/"* ]] ||
  fail "build directory '$dir' is inside LOG_DIR $work/logs1"
[[ $(ls "$work/logs1") == gpu_check.log ]] || fail "LOG_DIR holds more than gpu_check.log"

# With BUILD_DIR (this build): every step after the build, in the header's order.
: > "$work/fmnist/train-images-idx3-ubyte.gz"  # train-cnn-gpu looks for the data first
rc=0
FASHION_MNIST_DIR=$work/fmnist GPU_CHECK_BUDGET_SECONDS=0 "$script" "$work/logs2" "$build" \
  > "$work/out2" 2>&1 || rc=$?
cat "$work/out2"
[[ $rc -eq 1 ]] || fail "exit status $rc with BUILD_DIR, expected 1"
want="nvidia-smi ldd gpu-kernels gpu-nccl1 unit-cpu-refs bench gpu-train-model train-cnn-gpu"
want+=" doctor-gpu gpu-staged2 gpu-auto1 gpu-replicas gpubench-nccl gpubench-bucket"
# The *-build steps appear only where this build lacks a target; they are not the point here.
got=$(sed -n 's/^== FAIL \([^ ]*\) (budget.*/\1/p' "$work/out2" | grep -v -- '-build$' | xargs)
[[ $got == "$want" ]] || fail "steps refused: '$got', expected '$want'"
tail -n 1 "$work/out2" | grep -qx 'gpu_check: FAILED' || fail "no verdict line at the end"
# Without BUILD_DIR on a machine whose nvidia-smi fails: no build, a verdict at once.
mkdir -p "$work/stub"
printf '#!/bin/sh\necho "NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver."\nexit 9\n' \
  > "$work/stub/nvidia-smi"
chmod +x "$work/stub/nvidia-smi"
rc=0
start=$SECONDS
PATH=$work/stub:$PATH "$script" "$work/logs3" > "$work/out3" 2>&1 || rc=$?
cat "$work/out3"
[[ $rc -eq 1 ]] || fail "exit status $rc with a failing nvidia-smi, expected 1"
(( SECONDS - start < 30 )) || fail "took $((SECONDS - start)) s with a failing nvidia-smi"
! grep -q '^== .* configure' "$work/out3" || fail "configured a build with a failing nvidia-smi"
tail -n 1 "$work/out3" | grep -q '^gpu_check: FAILED (nvidia-smi: no working NVIDIA driver' ||
  fail "no verdict naming nvidia-smi"
echo "ok gpu_check.sh reports every step under its budget, keeps its build out of LOG_DIR and builds nothing without a driver"
