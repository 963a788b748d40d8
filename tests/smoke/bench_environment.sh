#!/usr/bin/env bash
# What the environment does to a run shows in all_reduce_perf's header (bench/common/
# run_environment.h):
# 1. MWMS_ALGO and MWMS_TRANSPORT set: the "# Environment:" line and the JSON summary's
#    "environment" name them (and --backend overriding MWMS_TRANSPORT says so); unset: "none".
# 2. Under mpirun with --compare mpi: the "MPI at its best" hint appears only when
#    MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=-1 are not both set (mpirun -x passes them).
# Usage: bench_environment.sh ALL_REDUCE_PERF WORKDIR WITH_MPI(0|1)
set -euo pipefail
perf=$1
work=$2
with_mpi=$3
mkdir -p "$work"
export TF_CONFIG= MWMS_CONNECT_TIMEOUT_SECONDS=30 MWMS_TIMEOUT_SECONDS=60
unset MWMS_ALGO MWMS_TRANSPORT MWMS_SHM_DISABLE MALLOC_MMAP_MAX_ MALLOC_TRIM_THRESHOLD_
fail() { echo "FAIL: $1"; cat "$2"; exit 1; }

# 1. One process is enough: the header and the JSON are rank 0's.
MWMS_ALGO=ring MWMS_TRANSPORT=tcp timeout 60 "$perf" -b 8 -e 64 -n 1 -w 0 \
  --json "$work/env.json" > "$work/env.log" 2>&1 || fail "MWMS_ALGO=ring run" "$work/env.log"
grep -qx "# Environment: MWMS_ALGO=ring MWMS_TRANSPORT=tcp" "$work/env.log" ||
  fail "header does not name MWMS_ALGO and MWMS_TRANSPORT" "$work/env.log"
python3 - "$work/env.json" <<'EOF' || fail "JSON environment" "$work/env.json"
import json, sys
summary = json.load(open(sys.argv[1]))[-1]
assert summary["record"] == "summary", summary
assert summary["environment"] == {"MWMS_ALGO": "ring", "MWMS_TRANSPORT": "tcp"}, summary
EOF
MWMS_TRANSPORT=tcp timeout 60 "$perf" -b 8 -e 8 -n 1 -w 0 --backend shm > "$work/flag.log" 2>&1 ||
  fail "--backend shm run" "$work/flag.log"
grep -qx "# Environment: MWMS_TRANSPORT=tcp (overridden by --backend shm)" "$work/flag.log" ||
  fail "header does not say --backend overrides MWMS_TRANSPORT" "$work/flag.log"
timeout 60 "$perf" -b 8 -e 8 -n 1 -w 0 > "$work/none.log" 2>&1 || fail "plain run" "$work/none.log"
grep -qx "# Environment: none (library defaults)" "$work/none.log" ||
  fail "header of a run without forcing variables" "$work/none.log"
echo "ok: forced algorithm and transport in the header and the JSON"

# 2. The glibc hint, only where it applies.
[ "$with_mpi" = 1 ] && command -v mpirun > /dev/null || { echo "no MPI: hint not checked"; exit 0; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=-1 timeout 120 mpirun --oversubscribe -np 2 \
  -x MALLOC_MMAP_MAX_ -x MALLOC_TRIM_THRESHOLD_ "$perf" -b 8 -e 64 -n 1 -w 0 --compare mpi \
  > "$work/tuned.log" 2>&1 || fail "mpirun with MALLOC_*" "$work/tuned.log"
grep -q "^# glibc keeps freed memory in this run: yes" "$work/tuned.log" ||
  fail "MALLOC_* set but not seen" "$work/tuned.log"
if grep -q "MPI at its best" "$work/tuned.log"; then fail "hint printed although set" "$work/tuned.log"; fi
MALLOC_MMAP_MAX_=0 timeout 120 mpirun --oversubscribe -np 2 -x MALLOC_MMAP_MAX_ "$perf" -b 8 -e 64 \
  -n 1 -w 0 --compare mpi > "$work/half.log" 2>&1 || fail "mpirun with MALLOC_MMAP_MAX_" "$work/half.log"
grep -q "^# glibc keeps freed memory in this run: no (MALLOC_TRIM_THRESHOLD_ is not -1)" \
  "$work/half.log" || fail "missing MALLOC_TRIM_THRESHOLD_ not named" "$work/half.log"
grep -q "^# MPI at its best: mpirun -x MALLOC_MMAP_MAX_=0 -x MALLOC_TRIM_THRESHOLD_=-1" \
  "$work/half.log" || fail "no hint although MALLOC_TRIM_THRESHOLD_ is unset" "$work/half.log"
echo "ok: the MPI hint only without MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=-1"
