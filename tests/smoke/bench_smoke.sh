#!/usr/bin/env bash
# Smoke run of all_reduce_perf as users run it: under mpirun with --compare mpi and --json, and as
# two TF_CONFIG processes for every dtype. Each run checks every result (#wrong must be 0) and
# exits non-zero otherwise; here we also check --backend (the banner names the links used), the
# nccl-tests footer, the JSON rows and summary record, and the refusal of --compare mpi without MPI. Usage: bench_smoke.sh ALL_REDUCE_PERF WORKDIR
set -euo pipefail
perf=$1
work=$2
mkdir -p "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export MWMS_CONNECT_TIMEOUT_SECONDS=30 MWMS_TIMEOUT_SECONDS=60

# 1. mpirun -np 2, --backend tcp, --compare mpi, --json: sizes 8 B .. 1 MiB.
timeout 300 mpirun --oversubscribe -np 2 "$perf" -b 8 -e 1M -f 4 -n 3 -w 1 --backend tcp \
  --compare mpi --json "$work/ar.json" > "$work/mpi.log" 2>&1 ||
  { echo "FAIL mpirun"; cat "$work/mpi.log"; exit 1; }
rows=$(grep -o '"record": "row"' "$work/ar.json" | wc -l)
[ "$rows" -ge 9 ] || { echo "FAIL: $rows JSON rows"; cat "$work/ar.json"; exit 1; }
for key in size count type redop ranks backend time_us algbw busbw wrong mpi_time_us mpi_busbw ratio; do
  grep -q "\"$key\"" "$work/ar.json" || { echo "FAIL: JSON key $key missing"; exit 1; }
done
if grep -Eq '"wrong": *[1-9]' "$work/ar.json"; then echo "FAIL: wrong results"; exit 1; fi
# nccl-tests' footer, byte for byte ("# %-20s : %d %s", "# %-20s : %g ").
grep -q "^# Out of bounds values : 0 OK$" "$work/mpi.log" || { echo "FAIL footer"; cat "$work/mpi.log"; exit 1; }
grep -Eq "^# Avg bus bandwidth    : [0-9.e+-]+ $" "$work/mpi.log" ||
  { echo "FAIL: no Avg bus bandwidth line"; cat "$work/mpi.log"; exit 1; }
grep -q "^# Backend: tcp requested; used: engine backend, links: 1 tcp" "$work/mpi.log" ||
  { echo "FAIL: banner does not name the tcp links"; cat "$work/mpi.log"; exit 1; }
grep -q "MALLOC_MMAP_MAX_=0" "$work/mpi.log" || { echo "FAIL: no MPI malloc hint"; exit 1; }
# The summary record: last in the array, with the footer's numbers.
for key in '"record": "summary"' '"out_of_bounds": 0' '"ok": true' '"avg_busbw"' '"avg_mpi_busbw"' \
    '"median_ratio"' '"describe": "engine backend, links: 1 tcp' '"backend": "tcp"' '"mpi_library"'; do
  grep -q "$key" "$work/ar.json" || { echo "FAIL: JSON summary lacks $key"; cat "$work/ar.json"; exit 1; }
done
echo "ok mpirun: $rows rows, 0 wrong"

# 1b. Without --backend the library's MWMS_TRANSPORT decides, as for any user program.
MWMS_TRANSPORT=tcp timeout 120 mpirun --oversubscribe -np 2 -x MWMS_TRANSPORT "$perf" -b 8 -e 64K \
  -f 64 -n 2 -w 1 > "$work/env.log" 2>&1 || { echo "FAIL MWMS_TRANSPORT=tcp"; cat "$work/env.log"; exit 1; }
grep -q "^# Backend: tcp requested; used: engine backend, links: 1 tcp" "$work/env.log" ||
  { echo "FAIL: MWMS_TRANSPORT=tcp not used"; cat "$work/env.log"; exit 1; }
if timeout 60 "$perf" -b 8 -e 8 --backend carrier-pigeon > "$work/badbackend.log" 2>&1; then
  echo "FAIL: --backend carrier-pigeon accepted"; exit 1
fi
grep -q "backend" "$work/badbackend.log" || { echo "FAIL: no reason"; cat "$work/badbackend.log"; exit 1; }
echo "ok --backend from MWMS_TRANSPORT; bad --backend refused"

# 2. Two TF_CONFIG processes, every dtype (with a fitting op), no MPI.
# Ports below the kernel's ephemeral range (ip_local_port_range), where no outgoing connection of
# another process can hold them; a port taken between the probe and the bind anyway is retried.
ephemeral_low=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
free_port() {
  local p
  while :; do
    p=$(( (RANDOM % (ephemeral_low - 10000)) + 10000 ))
    [ "$p" != "${1:-}" ] || continue
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
  done
}
run_pair() {  # run_pair DTYPE OP BACKEND: two TF_CONFIG workers; 0 ok, 1 failed, 2 port taken (retry)
  local p0 p1 cluster pid status=0
  p0=$(free_port); p1=$(free_port "$p0")
  cluster="{\"worker\":[\"127.0.0.1:$p0\",\"127.0.0.1:$p1\"]}"
  TF_CONFIG="{\"cluster\":$cluster,\"task\":{\"type\":\"worker\",\"index\":1}}" \
    timeout 120 "$perf" -b 4 -e 256K -f 8 -n 2 -w 1 -d "$1" -o "$2" --backend "$3" > "$work/tf1.log" 2>&1 &
  pid=$!
  TF_CONFIG="{\"cluster\":$cluster,\"task\":{\"type\":\"worker\",\"index\":0}}" \
    timeout 120 "$perf" -b 4 -e 256K -f 8 -n 2 -w 1 -d "$1" -o "$2" --backend "$3" > "$work/tf0.log" 2>&1 || status=1
  wait "$pid" || status=1
  if [ "$status" -ne 0 ] && grep -q "already in use" "$work/tf0.log" "$work/tf1.log"; then status=2; fi
  return "$status"
}
# auto is what users get by default; tcp is what the TCP-only runs of docs/PERFORMANCE.md measure.
for spec in float32:sum:tcp float64:prod:auto float16:mean:tcp bfloat16:max:auto int32:min:tcp \
    int64:sum:auto; do
  IFS=: read -r dtype op backend <<< "$spec"
  for attempt in 1 2 3; do
    status=0
    run_pair "$dtype" "$op" "$backend" || status=$?
    [ "$status" -eq 2 ] && [ "$attempt" -lt 3 ] && { echo "port taken, retrying $spec"; continue; }
    break
  done
  [ "$status" -eq 0 ] || { echo "FAIL tf_config $spec"; cat "$work/tf0.log" "$work/tf1.log"; exit 1; }
  grep -q "$dtype" "$work/tf0.log" || { echo "FAIL: no $dtype rows"; cat "$work/tf0.log"; exit 1; }
  grep -q "^# Out of bounds values : 0 OK$" "$work/tf0.log" || { echo "FAIL footer"; exit 1; }
  echo "ok tf_config $dtype $op --backend $backend"
done

# 3. --compare mpi without mpirun is refused with a reason, not a crash or a hang.
if timeout 60 "$perf" -b 8 -e 8 --compare mpi > "$work/nompi.log" 2>&1; then
  echo "FAIL: --compare mpi without mpirun succeeded"; exit 1
fi
grep -qi "mpi" "$work/nompi.log" || { echo "FAIL: no reason given"; cat "$work/nompi.log"; exit 1; }
echo "bench smoke passed"
