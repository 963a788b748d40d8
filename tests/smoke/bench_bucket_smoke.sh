#!/usr/bin/env bash
# Smoke run of bucket_perf on host buffers: 2 ranks under mpirun over shm and over tcp (the
# strategy's buckets against one all-reduce per tensor; both paths' results checked, #wrong must be
# 0), the table, footer and JSON; a reducing op other than sum on 16-bit floats; one process;
# and a bad flag refused with status 2. Small sizes: this checks the tool, not the speedup.
# Usage: bench_bucket_smoke.sh BUCKET_PERF WORKDIR
set -euo pipefail
perf=$1
work=$2
mkdir -p "$work"
unset TF_CONFIG
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export MWMS_CONNECT_TIMEOUT_SECONDS=30 MWMS_TIMEOUT_SECONDS=60

for backend in shm tcp; do
  json=$work/bucket-$backend.json
  # 50 tensors in 2 MiB, buckets of 256 KiB: several buckets, some tensors packed together.
  timeout 300 mpirun --oversubscribe -np 2 "$perf" -t 50 -s 2M --bytes-per-pack 256K -n 3 -w 1 \
    --backend "$backend" --json "$json" > "$work/$backend.log" 2>&1 ||
    { echo "FAIL mpirun --backend $backend"; cat "$work/$backend.log"; exit 1; }
  grep -q "^# Out of bounds values : 0 OK$" "$work/$backend.log" ||
    { echo "FAIL footer ($backend)"; cat "$work/$backend.log"; exit 1; }
  grep -Eq "^# Bucket speedup       : [0-9.e+-]+ \(separate / bucketed" "$work/$backend.log" ||
    { echo "FAIL: no speedup line ($backend)"; cat "$work/$backend.log"; exit 1; }
  grep -q "^# Backend: $backend requested; used: engine backend, links: 1 $backend" "$work/$backend.log" ||
    { echo "FAIL: banner does not name the $backend links"; cat "$work/$backend.log"; exit 1; }
  python3 - "$json" <<'PY' || { echo "FAIL JSON ($backend)"; cat "$json"; exit 1; }
import json, sys
row = json.load(open(sys.argv[1]))[0]
assert row["tool"] == "bucket_perf" and row["buffers"] == "host", row
assert row["ranks"] == 2 and row["tensors"] == 50 and row["size"] == 2 << 20, row
assert row["wrong"] == 0, row
assert row["bytes_per_pack"] == 256 << 10 and row["buckets"] >= 8, row  # 2 MiB / 256 KiB
assert row["bucketed_time_us"] > 0 and row["separate_time_us"] > 0, row
assert abs(row["speedup"] - row["separate_time_us"] / row["bucketed_time_us"]) < 1e-9, row
PY
  echo "ok mpirun --backend $backend: $(grep -E '^ +50 ' "$work/$backend.log")"
done

# Another dtype and op through both paths (bfloat16 max), default transport.
timeout 300 mpirun --oversubscribe -np 2 "$perf" -t 7 -s 64K -d bfloat16 -o max -n 2 -w 0 \
  > "$work/bf16.log" 2>&1 || { echo "FAIL bfloat16 max"; cat "$work/bf16.log"; exit 1; }
grep -Eq '^ +7 +65536 .* bfloat16 +max .* 0$' "$work/bf16.log" ||
  { echo "FAIL: no bfloat16 max row with 0 wrong"; cat "$work/bf16.log"; exit 1; }
echo "ok bfloat16 max"

# One process (no launcher): nothing moves, both paths still run and are checked.
timeout 60 "$perf" -t 20 -s 64K -n 2 -w 0 > "$work/one.log" 2>&1 ||
  { echo "FAIL: one process"; cat "$work/one.log"; exit 1; }
grep -q "^# Out of bounds values : 0 OK$" "$work/one.log" || { echo "FAIL one footer"; exit 1; }
echo "ok one process"

status=0
"$perf" --backend shmm > "$work/bad.log" 2>&1 || status=$?
[ "$status" -eq 2 ] && grep -q "valid: auto, tcp, shm, mpi, nccl" "$work/bad.log" ||
  { echo "FAIL: --backend shmm: status $status"; cat "$work/bad.log"; exit 1; }
echo "ok bad --backend refused (exit 2)"
