#!/usr/bin/env bash
# Smoke run of all_gather_perf, reduce_scatter_perf or broadcast_perf under mpirun -np 3 (a rank
# count that does not divide the power-of-two sizes): once with --compare mpi and --json, then a few
# dtypes/ops. Every run checks each element and must exit 0 with 0 wrong; the JSON rows must show
# nccl-tests' sizes (the whole buffer, n * count elements for all-gather/reduce-scatter).
# Usage: bench_collective_smoke.sh TOOL_PERF WORKDIR
set -euo pipefail
perf=$1
work=$2
tool=$(basename "$perf")
name=${tool%_perf}
np=3
mkdir -p "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export MWMS_CONNECT_TIMEOUT_SECONDS=30 MWMS_TIMEOUT_SECONDS=60

run_ok() {  # run_ok ARGS...: must exit 0 with a clean footer
  local log="$work/$name.log"
  timeout 300 mpirun --oversubscribe -np "$np" "$perf" "$@" > "$log" 2>&1 ||
    { echo "FAIL: $tool $*"; cat "$log"; exit 1; }
  grep -q "^# Out of bounds values : 0 OK$" "$log" || { echo "FAIL footer: $tool $*"; cat "$log"; exit 1; }
  grep -Eq "^# Avg bus bandwidth    : [0-9.e+-]+ $" "$log" ||
    { echo "FAIL: no Avg bus bandwidth line: $tool $*"; cat "$log"; exit 1; }
  echo "ok $tool $*"
}
run_refused() {  # run_refused PATTERN ARGS...: must exit non-zero, saying PATTERN
  local pattern=$1 log="$work/$name-refused.log"
  shift
  if timeout 120 mpirun --oversubscribe -np "$np" "$perf" "$@" > "$log" 2>&1; then
    echo "FAIL: $tool $* succeeded"; cat "$log"; exit 1
  fi
  grep -q -- "$pattern" "$log" || { echo "FAIL: no '$pattern' for $tool $*"; cat "$log"; exit 1; }
  echo "ok $tool $* refused"
}

case $name in
  all_gather) extra=(-d float32) more=("-d bfloat16" "-d int64" "-d float16") ;;
  reduce_scatter) extra=(-d float32 -o sum)
    more=("-d float16 -o mean" "-d bfloat16 -o max" "-d int32 -o prod" "-d float64 -o min") ;;
  broadcast) extra=(-d float32 -r 1) more=("-d float16 -r 2" "-d int32" "-d bfloat16 -r 1") ;;
  *) echo "unknown tool $tool"; exit 2 ;;
esac

# 1. --backend tcp, --compare mpi and --json, 8 B .. 1 MiB.
json="$work/$name.json"
run_ok -b 8 -e 1M -f 4 -n 3 -w 1 "${extra[@]}" --backend tcp --compare mpi --json "$json"
grep -q "^# Backend: tcp requested; used: engine backend, links: 2 tcp" "$work/$name.log" ||
  { echo "FAIL: banner does not name the tcp links"; cat "$work/$name.log"; exit 1; }
rows=$(grep -c '"record": "row"' "$json")
[ "$rows" -ge 9 ] || { echo "FAIL: $rows JSON rows"; cat "$json"; exit 1; }
grep -q "\"collective\": \"$name\"" "$json" || { echo "FAIL: collective name"; cat "$json"; exit 1; }
for key in size count type redop ranks backend time_us algbw busbw wrong mpi_time_us mpi_busbw ratio; do
  grep -q "\"$key\"" "$json" || { echo "FAIL: JSON key $key missing"; exit 1; }
done
if grep -Eq '"wrong": *([1-9]|null)' "$json"; then echo "FAIL: wrong results"; exit 1; fi
for key in '"record": "summary"' '"out_of_bounds": 0' '"avg_busbw"' '"median_ratio"'; do
  grep -q "$key" "$json" || { echo "FAIL: JSON summary lacks $key"; cat "$json"; exit 1; }
done
# size = count * 4 (float32) on every row; for the blocked collectives count is a multiple of n.
sizes=$(grep -Eo '"size": *[0-9]+' "$json" | grep -Eo '[0-9]+$')
counts=$(grep -Eo '"count": *[0-9]+' "$json" | grep -Eo '[0-9]+$')
paste <(echo "$sizes") <(echo "$counts") | while read -r size count; do
  [ "$size" -eq $((count * 4)) ] || { echo "FAIL: size $size for count $count"; exit 1; }
  if [ "$name" != broadcast ] && [ $((count % np)) -ne 0 ]; then
    echo "FAIL: count $count is not a multiple of $np"; exit 1
  fi
done
if [ "$name" != reduce_scatter ]; then
  grep -q '"redop": "none"' "$json" || { echo "FAIL: redop should be none"; cat "$json"; exit 1; }
fi
echo "ok $tool JSON: $rows rows"

# 2. Other dtypes (and ops/roots), no MPI comparison.
for args in "${more[@]}"; do
  # shellcheck disable=SC2086  # word splitting of the flag list is intended
  run_ok -b 4 -e 256K -f 8 -n 2 -w 1 $args
done

# 3. Refusals: MPI has no float16; broadcast's root must be a rank.
run_refused "float16" -b 8 -e 8 -d float16 --compare mpi
if [ "$name" = broadcast ]; then run_refused "is not a rank" -b 8 -e 8 -r "$np"; fi
echo "$tool smoke passed"
