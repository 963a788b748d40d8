#!/usr/bin/env bash
# Smoke run of all_reduce_perf --compare gloo (bench built with Debian's libgloo-dev): under
# mpirun beside MPI (--compare mpi,gloo) and as two TF_CONFIG processes; the Gloo columns, footer
# lines and JSON keys must be there, every libmwms result checked (#wrong 0), and the tools
# without a Gloo equivalent must refuse the flag. Without Gloo the refusal is checked and the test
# skips (77). Usage: bench_gloo_smoke.sh ALL_REDUCE_PERF ALL_GATHER_PERF WORKDIR
set -euo pipefail
perf=$1
gather=$2
work=$3
mkdir -p "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export MWMS_CONNECT_TIMEOUT_SECONDS=30 MWMS_TIMEOUT_SECONDS=60

if ! timeout 60 "$perf" -b 8 -e 8 -n 1 -w 0 --compare gloo > "$work/one.log" 2>&1; then
  if grep -q "built without Gloo" "$work/one.log"; then
    echo "skipped: this bench was built without Gloo (Debian package libgloo-dev)"
    exit 77
  fi
  echo "FAIL: one process --compare gloo"; cat "$work/one.log"; exit 1
fi

# mpirun -np 2: libmwms, Open MPI and Gloo's two algorithms in one run.
timeout 300 mpirun --oversubscribe -np 2 "$perf" -b 8 -e 1M -f 16 -n 3 -w 1 --backend tcp \
  --compare mpi,gloo --json "$work/ar.json" > "$work/mpi.log" 2>&1 ||
  { echo "FAIL mpirun --compare mpi,gloo"; cat "$work/mpi.log"; exit 1; }
for key in mpi_busbw ratio gloo_ring_time_us gloo_ring_busbw gloo_hd_time_us gloo_hd_busbw \
    gloo_ratio avg_gloo_ring_busbw avg_gloo_hd_busbw median_gloo_ratio gloo_library; do
  grep -q "\"$key\"" "$work/ar.json" || { echo "FAIL: JSON key $key missing"; cat "$work/ar.json"; exit 1; }
done
if grep -Eq '"wrong": *[1-9]' "$work/ar.json"; then echo "FAIL: wrong results"; exit 1; fi
grep -q "ring time  ring busbw    hd time   hd busbw  vs gloo" "$work/mpi.log" || { echo "FAIL: no Gloo columns"; cat "$work/mpi.log"; exit 1; }
grep -Eq "^# Median vs Gloo best  : [0-9.e+-]+ " "$work/mpi.log" ||
  { echo "FAIL: no Gloo footer"; cat "$work/mpi.log"; exit 1; }
# Every row has a positive Gloo busbw for both algorithms (they ran, on 2 ranks).
if grep -Eq '"gloo_(ring|hd)_busbw": *0(\.0)?[,}]' "$work/ar.json"; then
  echo "FAIL: a Gloo algorithm did not run"; cat "$work/ar.json"; exit 1
fi
echo "ok mpirun --compare mpi,gloo"

# Two TF_CONFIG processes (no MPI), a size that is not a multiple of the world size.
p0=$(( (RANDOM % 10000) + 10000 )); p1=$(( p0 + 1 ))
cluster="{\"worker\":[\"127.0.0.1:$p0\",\"127.0.0.1:$p1\"]}"
TF_CONFIG="{\"cluster\":$cluster,\"task\":{\"type\":\"worker\",\"index\":1}}" \
  timeout 120 "$perf" -b 4100 -e 4100 -n 2 -w 1 -d int64 -o max --compare gloo > "$work/tf1.log" 2>&1 &
pid=$!
status=0
TF_CONFIG="{\"cluster\":$cluster,\"task\":{\"type\":\"worker\",\"index\":0}}" \
  timeout 120 "$perf" -b 4100 -e 4100 -n 2 -w 1 -d int64 -o max --compare gloo > "$work/tf0.log" 2>&1 || status=1
wait "$pid" || status=1
[ "$status" -eq 0 ] || { echo "FAIL: TF_CONFIG --compare gloo"; cat "$work/tf0.log" "$work/tf1.log"; exit 1; }
grep -q "^# Out of bounds values : 0 OK$" "$work/tf0.log" || { echo "FAIL footer"; cat "$work/tf0.log"; exit 1; }
echo "ok TF_CONFIG --compare gloo"

# Refusals: no Gloo equivalent, no Gloo dtype.
if timeout 60 "$gather" -b 8 -e 8 --compare gloo > "$work/gather.log" 2>&1; then
  echo "FAIL: all_gather_perf accepted --compare gloo"; exit 1
fi
grep -q "only all_reduce_perf times Gloo" "$work/gather.log" || { echo "FAIL: no reason"; cat "$work/gather.log"; exit 1; }
if timeout 60 "$perf" -b 8 -e 8 -d float16 --compare gloo > "$work/f16.log" 2>&1; then
  echo "FAIL: float16 accepted with --compare gloo"; exit 1
fi
grep -q "not float16" "$work/f16.log" || { echo "FAIL: no reason"; cat "$work/f16.log"; exit 1; }
echo "ok refusals"
