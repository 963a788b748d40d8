#!/usr/bin/env bash
# --backend nccl where it cannot run fails cleanly, before anything starts: in a build without
# NCCL with status 2 and "this build has no NCCL"; in a build with NCCL on a machine without a
# usable GPU (CI) with status 1 and the CUDA reason. On a machine with a GPU the same commands
# must succeed instead, with a checked row (scripts/gpu_check.sh runs the real sweep).
# Usage: bench_nccl_backend.sh HAVE_NCCL(0|1) ALL_REDUCE_PERF BUCKET_PERF
set -euo pipefail
have_nccl=$1
shift
unset TF_CONFIG
for perf in "$@"; do
  tool=$(basename "$perf")
  if [[ $tool == bucket_perf ]]; then args=(-t 4 -s 4K -n 1 -w 0); else args=(-b 8 -e 8 -n 1 -w 0); fi
  status=0
  out=$(timeout 120 "$perf" "${args[@]}" --backend nccl 2>&1) || status=$?
  if [[ $have_nccl == 0 ]]; then
    [[ $status -eq 2 ]] && grep -q -- "--backend nccl: this build has no NCCL" <<< "$out" ||
      { echo "FAIL: $tool --backend nccl without NCCL: status $status: $out"; exit 1; }
  elif [[ $status -eq 1 ]] && grep -q -- "--backend nccl needs a CUDA device" <<< "$out"; then
    grep -Eq "cudaGetDeviceCount: (cudaError[A-Za-z]+|no CUDA device)" <<< "$out" ||
      { echo "FAIL: $tool: the reason lacks the CUDA error: $out"; exit 1; }
    # Nothing else on stderr/stdout: one clean line, no backtrace or half-printed table.
    [[ $(wc -l <<< "$out") -eq 1 ]] || { echo "FAIL: $tool printed more than the reason: $out"; exit 1; }
  elif [[ $status -eq 0 ]]; then
    grep -Eq "Out of bounds values : 0 OK" <<< "$out" ||
      { echo "FAIL: $tool on a GPU: no clean check: $out"; exit 1; }
  else
    echo "FAIL: $tool --backend nccl: status $status: $out"; exit 1
  fi
  echo "ok $tool --backend nccl (build with NCCL: $have_nccl): status $status: $(head -1 <<< "$out")"
done
