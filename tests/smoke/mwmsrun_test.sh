#!/usr/bin/env bash
# mwmsrun end to end: a real 2-process job, the first failure ending the others with its status,
# SIGTERM forwarded, --print-tf-config of a multi-host job read back by mwms-doctor, usage errors.
# Usage: mwmsrun_test.sh MWMSRUN ALL_REDUCE_PERF MWMS_DOCTOR WORKDIR
set -uo pipefail
run=$1 perf=$2 doctor=$3 work=$4
mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }

# 1. A real job: both ranks' lines prefixed, exit 0.
out=$("$run" -np 2 -- "$perf" -b 1K -e 4K -n 2 -w 1 2>&1) || fail "2-process all_reduce_perf: $out"
grep -q '^\[0\] # Avg bus bandwidth' <<<"$out" || fail "no [0]-prefixed summary line: $out"
grep -q '^\[0\] # Ranks: 2' <<<"$out" || fail "not one world of 2: $out"

# 1b. Each task inherits the socket listening on its port, and only that one (every other
#     descriptor of mwmsrun is close-on-exec), named by MWMS_LISTEN_FD; libmwms adopts it
#     (Note [inherited listener]). One task has no listener and gets no variable.
out=$(MWMS_LOG_LEVEL=debug MWMS_LOG_SUBSYS=BOOT "$run" -np 2 -- "$perf" -b 1K -e 1K -n 1 -w 0 2>&1) \
  || fail "2-process job with debug logging: $out"
for r in 0 1; do
  grep -q "^\[$r\] .*listening on the socket inherited as MWMS_LISTEN_FD=" <<<"$out" \
    || fail "rank $r did not adopt its inherited listener: $out"
done
# Sockets this script's caller passed down (a CI agent may leak some) count for every process.
count_sockets='n=0; s=; for f in /proc/$$/fd/*; do
  case "$(readlink "$f")" in socket:*) n=$((n + 1)); s=${f##*/};; esac; done
  echo "sockets=$n fd=$s env=${MWMS_LISTEN_FD-}"'
base=$(sh -c "$count_sockets" | sed 's/^sockets=\([0-9]*\).*/\1/')
out=$("$run" -np 3 -- sh -c "$count_sockets" 2>&1) || fail "fd listing: $out"
if [ "$base" -eq 0 ]; then
  [ "$(grep -c 'sockets=1 fd=\([0-9][0-9]*\) env=\1$' <<<"$out")" -eq 3 ] \
    || fail "not exactly one inherited socket per task, named by MWMS_LISTEN_FD: $out"
else
  [ "$(grep -c "sockets=$((base + 1)) fd=.* env=[0-9]" <<<"$out")" -eq 3 ] \
    || fail "not exactly one more socket per task than the $base inherited here: $out"
fi
out=$(MWMS_LISTEN_FD=9 "$run" -np 1 -- sh -c 'echo "env=${MWMS_LISTEN_FD-unset}"' 2>&1)
[ "$out" = "[0] env=unset" ] || fail "-np 1 passed a listener variable: $out"

# 2. Rank 1 fails with status 3 while the others would run for a minute: mwmsrun exits 3 at
#    once and leaves nothing behind.
marker="$work/mwmsrun-test-$$.sh"
printf 'sleep 61\nsleep 61\n' > "$marker"
start=$(date +%s)
"$run" -np 3 --grace 1 -- sh -c 'case "$TF_CONFIG" in *"\"index\":1,"*|*"\"index\":1}"*) exit 3;;
  *) exec sh "$0";; esac' "$marker" > "$work/fail.log" 2>&1
rc=$?
took=$(( $(date +%s) - start ))
[ "$rc" -eq 3 ] || fail "exit status $rc, expected rank 1's 3: $(cat "$work/fail.log")"
[ "$took" -le 15 ] || fail "took ${took}s to stop the others"
grep -q "rank 1 exited with status 3" "$work/fail.log" || fail "failure not reported: $(cat "$work/fail.log")"
sleep 0.5
if pgrep -f "$marker" > /dev/null; then fail "processes left running"; fi

# 3. SIGTERM to mwmsrun reaches every process (each prints and exits 7); mwmsrun exits 128+15.
"$run" -np 2 -- sh -c 'trap "echo got-term; exit 7" TERM; echo up; while :; do sleep 0.05; done' \
  > "$work/term.log" 2>&1 &
pid=$!
for _ in $(seq 1 100); do [ "$(grep -c '] up' "$work/term.log")" -ge 2 ] && break; sleep 0.05; done
kill -TERM "$pid"
wait "$pid"
rc=$?
[ "$rc" -eq 143 ] || fail "exit status $rc after SIGTERM, expected 143: $(cat "$work/term.log")"
for r in 0 1; do
  grep -q "^\[$r\] got-term" "$work/term.log" || fail "rank $r did not get SIGTERM: $(cat "$work/term.log")"
done

# 3b. mwmsrun itself SIGKILLed: its processes do not outlive it.
marker2="$work/mwmsrun-orphan-$$.sh"
printf 'sleep 62\nsleep 62\n' > "$marker2"
"$run" -np 2 -- sh "$marker2" > /dev/null 2>&1 &
pid=$!
for _ in $(seq 1 100); do [ "$(pgrep -fc "$marker2")" -ge 2 ] && break; sleep 0.05; done
kill -KILL "$pid"
wait "$pid" 2> /dev/null
for _ in $(seq 1 40); do pgrep -f "$marker2" > /dev/null || break; sleep 0.05; done
if pgrep -f "$marker2" > /dev/null; then pkill -f "$marker2"; fail "processes outlived a killed mwmsrun"; fi

# 4. --print-tf-config of 2 hosts x 2: every task's TF_CONFIG resolves to its rank in a world of 4.
"$run" --hosts h1:2,h2:2 --print-tf-config > "$work/tf.txt" || fail "--print-tf-config"
[ "$(grep -c "^TF_CONFIG='" "$work/tf.txt")" -eq 4 ] || fail "expected 4 TF_CONFIGs: $(cat "$work/tf.txt")"
i=0
while IFS= read -r line; do
  printf '%s' "${line#TF_CONFIG=\'}" | sed "s/'\$//" > "$work/tf$i.json"
  j=$("$doctor" --json --tf_config "$work/tf$i.json") || fail "doctor refused task $i: $j"
  grep -q "\"task_id\":$i," <<<"$j" || fail "task $i resolved as $j"
  grep -q '"num_workers":4' <<<"$j" || fail "task $i: not a world of 4: $j"
  i=$((i + 1))
done < <(grep "^TF_CONFIG=" "$work/tf.txt")
grep -q '"h2:23457"' "$work/tf.txt" || fail "second slot of h2 not at port-base + 1"
"$run" -np 3 --chief --print-tf-config | grep -q '"type":"chief"' || fail "--chief"

# 5. Usage errors exit 2 with a message.
"$run" -np 2 > "$work/u1.log" 2>&1; [ $? -eq 2 ] || fail "no PROGRAM: not 2"
"$run" -np 2 -- /nonexistent/program > "$work/u2.log" 2>&1; [ $? -eq 2 ] || fail "bad PROGRAM: not 2"
grep -q "cannot start /nonexistent/program" "$work/u2.log" || fail "$(cat "$work/u2.log")"
"$run" --hosts 'h1:0' --print-tf-config > "$work/u3.log" 2>&1; [ $? -eq 2 ] || fail "h1:0 accepted"
"$run" -np 2 --chif -- true > "$work/u4.log" 2>&1; [ $? -eq 2 ] || fail "unknown option accepted"
grep -q "unknown option --chif" "$work/u4.log" || fail "$(cat "$work/u4.log")"
"$run" -np 3 --hosts h1:2 --print-tf-config > "$work/u5.log" 2>&1; [ $? -eq 2 ] || fail "-np 3 vs 2 slots accepted"
[ "$("$run" -np2 --print-tf-config | grep -c "^TF_CONFIG=")" -eq 2 ] || fail "-np2 (glued) not read as 2"
"$run" -np abc -- true > "$work/u6.log" 2>&1; [ $? -eq 2 ] || fail "-np abc accepted"
grep -q "'abc' is not a number" "$work/u6.log" || fail "-np abc: $(cat "$work/u6.log")"
"$run" -np 0 -- true > "$work/u7.log" 2>&1; [ $? -eq 2 ] || fail "-np 0 accepted"
grep -q "0 is not in \[1 - 1024\]" "$work/u7.log" || fail "-np 0: $(cat "$work/u7.log")"
# --help: one usage line, the real one (CLI11's own read "Usage: [OPTIONS]").
"$run" --help > "$work/help.log" 2>&1 || fail "--help exited $?"
[ "$(grep -c 'Usage:' "$work/help.log")" -eq 1 ] || fail "not one Usage line: $(cat "$work/help.log")"
grep -q '^Usage: mwmsrun -np N ' "$work/help.log" || fail "--help usage: $(cat "$work/help.log")"

# 6. A survivor that fails by itself shortly after the first failure keeps its last line (it is
#    not SIGTERMed at once, Note [mwmsrun shutdown]).
"$run" -np 2 -- sh -c 'case "$TF_CONFIG" in *"\"index\":1"*) exit 3;; *) sleep 0.3; echo survivor-error; exit 4;; esac' \
  > "$work/settle.log" 2>&1
grep -q '^\[0\] survivor-error' "$work/settle.log" || fail "survivor's last line cut: $(cat "$work/settle.log")"
# 7. A stopped rank that ignores SIGTERM: mwmsrun sends SIGCONT first (the rank runs again and
#    says so), then SIGTERM, then after --grace SIGKILL, naming the rank it had to kill. Rank 1
#    fails after 1 s, by when rank 0 has stopped itself.
"$run" -np 2 --grace 1 -- sh -c 'case "$TF_CONFIG" in *"\"index\":1"*) sleep 1; exit 3;;
  *) trap "" TERM; trap "echo continued" CONT; kill -STOP $$; while :; do sleep 0.05; done;; esac' \
  > "$work/stopped.log" 2>&1
rc=$?
[ "$rc" -eq 3 ] || fail "stopped rank: exit status $rc, expected 3: $(cat "$work/stopped.log")"
grep -q '^\[0\] continued' "$work/stopped.log" || fail "no SIGCONT: $(cat "$work/stopped.log")"
grep -q 'mwmsrun: rank(s) 0 still running 1 s after SIGTERM (--grace): sending SIGKILL' \
  "$work/stopped.log" || fail "SIGKILL not reported: $(cat "$work/stopped.log")"
echo "mwmsrun: all checks passed"
