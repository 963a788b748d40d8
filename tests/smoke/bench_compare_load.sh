#!/usr/bin/env bash
# all_reduce_perf --compare mpi must never deadlock (issue 20, item 5; Note [leaving mpi] in
# bench/common/driver.cc): 4 ranks on this machine's cores with two busy CPU hogs beside them,
# Open MPI over its TCP BTL and libmwms over TCP, the sizes where one rank used to sit in
# MPI_Allreduce while the other three waited in libmwms. libmwms's own deadline is short here, so
# a hang shows as a failed run naming the collective (and the outer timeout catches the rest).
# Every row must also be correct (#wrong 0). Usage: bench_compare_load.sh ALL_REDUCE_PERF WORKDIR
set -euo pipefail
perf=$1
work=$2
mkdir -p "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export MWMS_CONNECT_TIMEOUT_SECONDS=30 MWMS_TIMEOUT_SECONDS=40
runs=${MWMS_COMPARE_LOAD_RUNS:-2}

hogs=()
cleanup() { for h in "${hogs[@]}"; do kill "$h" 2>/dev/null || true; done; }
trap cleanup EXIT
for _ in 1 2; do
  (while :; do :; done) &
  hogs+=($!)
done

for run in $(seq 1 "$runs"); do
  log="$work/run$run.log"
  start=$SECONDS
  rc=0
  timeout -k 5 150 mpirun --oversubscribe -np 4 --mca btl self,tcp "$perf" --backend tcp \
    -b 16M -e 256M -f 4 -n 6 -w 2 --compare mpi > "$log" 2>&1 || rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "FAIL: run $run of --compare mpi under load exited $rc after $((SECONDS - start)) s" \
      "(124: hung past 150 s)"
    tail -40 "$log"
    exit 1
  fi
  rows=$(grep -Ec '^ +[0-9]+ +[0-9]+ +float' "$log" || true)
  [ "$rows" -eq 3 ] || { echo "FAIL: run $run printed $rows rows, not 3"; cat "$log"; exit 1; }
  grep -Eq "Out of bounds values *: 0 OK" "$log" ||
    { echo "FAIL: run $run had wrong values"; cat "$log"; exit 1; }
  echo "ok run $run: 16M-256M, 4 ranks, 2 hogs, --compare mpi in $((SECONDS - start)) s"
done
