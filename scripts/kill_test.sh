#!/usr/bin/env bash
# Kill test (docs/RELIABILITY.md "Peer death" and "Stopped peer"): RUNS jobs of 3 or 4 ranks of
# mwms_kill_worker (random verified collectives), spread round-robin over the transports; in each
# job one random rank gets SIGKILL (or, in every STOP_EVERY-th run, SIGSTOP) at a random moment
# after every rank is READY. For each run it records whether every survivor failed, with which
# error class, whether the error names the victim (ErrorContext::peer_rank), the time from the
# signal to each survivor's error and to its exit, that no process outlives the deadline
# (collective timeout + GRACE seconds), that no survivor returned a wrong result, and that no
# /dev/shm file the job mapped is left behind. A stopped rank is SIGKILLed once its survivors
# are gone. A run passes when every survivor failed, every one named the killed or stopped
# rank (Note [stall blame]), nothing hung, nothing was wrong, nothing was left and
# no sanitizer report appeared in the logs (a sanitizer build: --build build-asan).
#
# Usage: scripts/kill_test.sh [options]
#   -n RUNS          runs (default 50)
#   -t LIST          transports, comma separated (default tcp,shm,mpi; mpi needs mpirun)
#   --stop-every K   every K-th run uses SIGSTOP instead of SIGKILL (default 8; 0: never)
#   --timeout S      the workers' collective timeout, MWMS seconds (default 5)
#   --grace S        extra seconds before a survivor counts as hung (default 10)
#   --seed N         seed of the script's random choices (default: random)
#   --build DIR      build directory with bin/mwms_kill_worker and bin/mwmsrun (default build)
#   --out DIR        keep logs and results.tsv there (default: a temporary directory, removed
#                    when every run passed)
# Exit status: 0 when every run passed, 1 when one failed (its logs are kept), 2 bad usage,
# 77 when nothing could run (no worker binary).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

runs=50 transports=tcp,shm,mpi stop_every=8 timeout=5 grace=10 seed=$RANDOM build=build out=""
usage_error() { echo "kill_test.sh: $* (see --help)" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    -n|-t|--stop-every|--timeout|--grace|--seed|--build|--out)
      [ $# -ge 2 ] || usage_error "$1 needs a value" ;;
  esac
  case "$1" in
    -n) runs=$2; shift 2 ;;
    -t) transports=$2; shift 2 ;;
    --stop-every) stop_every=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    --grace) grace=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) usage_error "unknown option $1" ;;
  esac
done
for v in runs:-n stop_every:--stop-every timeout:--timeout grace:--grace seed:--seed; do
  name=${v%%:*}
  [[ ${!name} =~ ^[0-9]+$ ]] || usage_error "${v#*:} must be a whole number, not '${!name}'"
done
worker=$build/bin/mwms_kill_worker
mwmsrun=$build/bin/mwmsrun
[ -x "$worker" ] && [ -x "$mwmsrun" ] ||
  { echo "kill_test.sh: skipped: build $worker and $mwmsrun first"; exit 77; }
IFS=, read -r -a tlist <<< "$transports"
if [[ ",$transports," == *",mpi,"* ]] && ! command -v mpirun > /dev/null; then
  echo "kill_test.sh: no mpirun: leaving out the mpi transport"
  tlist=("${tlist[@]/mpi}")
  read -r -a tlist <<< "${tlist[*]}"
fi
keep=1
if [ -z "$out" ]; then out=$(mktemp -d "${TMPDIR:-/tmp}/mwms-kill-test.XXXXXX"); keep=0; fi
mkdir -p "$out"
RANDOM=$seed
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# mpirun keeps its default: once a rank dies it ends the others itself, but only after the
# library's own detection (tens of ms) has made every survivor report (RELIABILITY.md "Peer
# death", under mpirun). With orte_abort_on_non_zero_status=0 mpirun never exits after a kill.

now_ns() { date +%s%N; }
# A process that exited (a zombie of ours counts as exited) or never existed.
alive() { [ -r "/proc/$1/stat" ] && [ "$(awk '{print $3}' "/proc/$1/stat" 2> /dev/null)" != Z ]; }
# The /dev/shm files our processes map or hold open (/dev/shm is shared with every other job on
# the machine, so only these are ours to account for).
shm_of() {
  for p in "$@"; do
    grep -ho '/dev/shm/[^ ]*' "/proc/$p/maps" 2> /dev/null
    for fd in /proc/"$p"/fd/*; do readlink "$fd" 2> /dev/null; done | grep '^/dev/shm/'
  done | sed 's/ (deleted)$//' | sort -u
}

columns=(run transport ranks signal victim delay_ms survivors failed named classes detect_ms
  exit_ms hung wrong shm_left ok)
(IFS=$'\t'; echo "${columns[*]}") > "$out/results.tsv"
failures=0
for ((run = 0; run < runs; ++run)); do
  t=${tlist[$((run % ${#tlist[@]}))]}
  n=$((3 + RANDOM % 2))
  sig=KILL
  [ "$stop_every" -gt 0 ] && [ $(((run + 1) % stop_every)) -eq 0 ] && sig=STOP
  dir=$out/run$run
  mkdir -p "$dir"
  pids=()
  if [ "$t" = mpi ]; then
    # Started from a subshell (here and below): not this shell's jobs, so bash reports no
    # "Killed" lines; the ranks' pids come from their READY lines.
    (mpirun -np "$n" --oversubscribe "$worker" --transport mpi --timeout "$timeout" \
      --seed "$run" > "$dir/mpirun.log" 2>&1 & echo $! > "$dir/launcher.pid")
    launcher=$(cat "$dir/launcher.pid")
    logs=("$dir/mpirun.log")
  else
    launcher=""
    mapfile -t cfgs < <("$mwmsrun" -np "$n" --print-tf-config 2> "$dir/mwmsrun.err" |
      grep "^TF_CONFIG=")
    logs=()
    for ((r = 0; r < n; ++r)); do
      # mwmsrun prints one line per task: TF_CONFIG='{...}' (the JSON after the first '=')
      cfg=${cfgs[$r]#*=}
      cfg=${cfg#\'}
      cfg=${cfg%\'}
      (TF_CONFIG=$cfg "$worker" --transport "$t" --timeout "$timeout" --seed "$run" \
        > "$dir/rank$r.log" 2>&1 &)
      logs+=("$dir/rank$r.log")
    done
  fi
  # Every rank READY (its pid from its own line: under mpirun the ranks are not our children).
  deadline=$(($(date +%s) + 60))
  while [ "$(cat "${logs[@]}" 2> /dev/null | grep -c '^READY')" -lt "$n" ] &&
    [ "$(date +%s)" -lt "$deadline" ]; do
    sleep 0.05
  done
  for ((r = 0; r < n; ++r)); do
    p=$(cat "${logs[@]}" | awk -v r="$r" '$1 == "READY" && $3 == r {print $5; exit}')
    [ -n "$p" ] && pids[r]=$p
  done
  ready=0
  for ((r = 0; r < n; ++r)); do [ -n "${pids[$r]:-}" ] && ready=$((ready + 1)); done
  if [ "$ready" -lt "$n" ]; then  # never send a signal to an unknown pid (kill 0 = our group)
    echo "kill_test: run $run ($t, n=$n): only $ready of $n ranks READY within 60 s; logs in $dir"
    for p in "${pids[@]}"; do [ -n "$p" ] && kill -KILL "$p" 2> /dev/null; done
    [ -n "$launcher" ] && kill -KILL "$launcher" 2> /dev/null
    printf '%d\t%s\t%d\t-\t-\t-\t-\t-\t-\tstartup\t-\t-\t0\t0\t0\t0\n' "$run" "$t" "$n" \
      >> "$out/results.tsv"
    failures=$((failures + 1)) keep=1
    continue
  fi
  delay_ms=$((200 + RANDOM % 1800))
  sleep "$(awk -v d="$delay_ms" 'BEGIN {printf "%.3f", d / 1000}')"
  victim=$((RANDOM % n))
  ours=$(shm_of "${pids[@]}" $launcher)
  t_kill=$(now_ns)
  kill -"$sig" "${pids[$victim]}" 2> /dev/null
  # Survivors must exit by themselves within the collective timeout + grace.
  hard=$((t_kill + (timeout + grace) * 1000000000))
  declare -A exit_ns=()
  while :; do
    left=0
    for ((r = 0; r < n; ++r)); do
      [ "$r" -eq "$victim" ] && continue
      [ -n "${exit_ns[$r]:-}" ] && continue
      if alive "${pids[$r]:-0}"; then left=$((left + 1)); else exit_ns[$r]=$(now_ns); fi
    done
    [ "$left" -eq 0 ] && break
    [ "$(now_ns)" -gt "$hard" ] && break
    sleep 0.01
  done
  hung=0
  for ((r = 0; r < n; ++r)); do
    [ "$r" -eq "$victim" ] && continue
    if alive "${pids[$r]:-0}"; then hung=$((hung + 1)); kill -KILL "${pids[$r]}" 2> /dev/null; fi
  done
  kill -KILL "${pids[$victim]}" 2> /dev/null   # the stopped one; a killed one is gone already
  if [ -n "$launcher" ]; then  # mpirun ends once its ranks are gone; give it a moment
    for ((w = 0; w < 50; ++w)); do alive "$launcher" || break; sleep 0.1; done
    alive "$launcher" && { hung=$((hung + 1)); kill -KILL "$launcher" 2> /dev/null; }
  fi
  # What each survivor said.
  failed=0 named=0 wrong=0 classes="" detect="" exits=""
  for ((r = 0; r < n; ++r)); do
    [ "$r" -eq "$victim" ] && continue
    line=$(cat "${logs[@]}" |
      awk -v r="$r" '($1 == "FAILED" || $1 == "WRONG") && $3 == r {print; exit}')
    case "$line" in
      FAILED*)
        failed=$((failed + 1))
        read -r _ _ _ _ _ _ cls _ peer _ _ _ tns _ <<< "$line"
        [ "$peer" = "$victim" ] && named=$((named + 1))
        [[ ",$classes," == *",$cls,"* ]] || classes=${classes:+$classes,}$cls
        detect="$detect $(((tns - t_kill) / 1000000))"
        ;;
      WRONG*) wrong=$((wrong + 1)) ;;
    esac
    [ -n "${exit_ns[$r]:-}" ] && exits="$exits $(((exit_ns[$r] - t_kill) / 1000000))"
  done
  unset exit_ns
  sleep 0.2
  shm_left=0
  for f in $ours; do
    [ -e "$f" ] && { shm_left=$((shm_left + 1)); echo "$f" >> "$dir/shm_left"; }
  done
  survivors=$((n - 1))
  # Every survivor names the victim: a killed rank closes its sockets; a stopped one only goes
  # quiet, and a survivor waiting on another survivor (itself waiting on the stopped rank, maybe
  # in an earlier collective) follows the stall notices to the end of the chain (Note [stall
  # blame] in src/collective/engine/control_plane.h).
  need=$survivors
  # A sanitizer build (scripts/run_sanitizers.sh) reports into the same logs: a report fails.
  sanitizer=$(cat "${logs[@]}" | grep -c 'Sanitizer\|runtime error:' || true)
  ok=1
  [ "$failed" -eq "$survivors" ] && [ "$named" -ge "$need" ] && [ "$hung" -eq 0 ] &&
    [ "$wrong" -eq 0 ] && [ "$shm_left" -eq 0 ] && [ "$sanitizer" -eq 0 ] || ok=0
  [ "$ok" -eq 1 ] || failures=$((failures + 1))
  max_of() { tr ' ' '\n' <<< "$1" | grep . | sort -n | tail -1; }
  printf '%d\t%s\t%d\tSIG%s\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%d\t%d\t%d\t%d\n' "$run" "$t" "$n" \
    "$sig" "$victim" "$delay_ms" "$survivors" "$failed" "$named" "${classes:--}" \
    "$(echo $detect | tr ' ' ,)" "$(echo $exits | tr ' ' ,)" "$hung" "$wrong" "$shm_left" "$ok" \
    >> "$out/results.tsv"
  verdict=""
  [ "$ok" -eq 1 ] || verdict=" FAILED (hung $hung, wrong $wrong, shm left $shm_left,"\
" sanitizer reports $sanitizer; logs in $dir)"
  printf 'kill_test: run %2d %-4s n=%d SIG%-4s victim %d: %d/%d survivors failed (%s), %d named it,'\
' error ms [%s], exit ms [%s]%s\n' "$run" "$t" "$n" "$sig" "$victim" "$failed" "$survivors" \
    "${classes:--}" "$named" "$(echo $detect)" "$(echo $exits)" "$verdict"
  [ "$ok" -eq 1 ] && [ "$keep" -eq 0 ] && rm -rf "$dir"
done

# Summary: detection times over every survivor, per signal.
tsv=$out/results.tsv
summary() {  # $1 = SIGKILL|SIGSTOP, $2 = column (11 detect, 12 exit)
  awk -F'\t' -v s="$1" -v c="$2" 'NR > 1 && $4 == s {
      n = split($c, a, ","); for (i = 1; i <= n; ++i) if (a[i] != "") print a[i] }' "$tsv" |
    sort -n | awk '{v[NR] = $1} END {if (NR == 0) {print "none"; exit}
      printf "min %d median %d max %d ms (%d survivors)", v[1], v[int((NR + 1) / 2)], v[NR], NR}'
}
col_sum() {  # $1 = column, $2 = signal (optional)
  awk -F'\t' -v c="$1" -v s="${2:-}" 'NR > 1 && (s == "" || $4 == s) {t += $c} END {print t + 0}' "$tsv"
}
echo "kill_test: $((runs - failures))/$runs runs passed (seed $seed, timeout $timeout s," \
  "transports ${tlist[*]})"
for s in SIGKILL SIGSTOP; do
  c=$(awk -F'\t' -v s="$s" 'NR > 1 && $4 == s' "$tsv" | wc -l)
  [ "$c" -gt 0 ] || continue
  classes=$(awk -F'\t' -v s="$s" 'NR > 1 && $4 == s {print $10}' "$tsv" | tr ',' '\n' |
    sort | uniq -c | awk '{printf "%s%s in %d runs", sep, $2, $1; sep = ", "}')
  echo "kill_test: $s: $c runs, $(col_sum 8 "$s") of $(col_sum 7 "$s") survivors failed" \
    "($classes), $(col_sum 9 "$s") named the victim"
  echo "kill_test: $s: signal to error: $(summary "$s" 11); to exit: $(summary "$s" 12)"
done
echo "kill_test: processes hung $(col_sum 13), wrong results (data lost) $(col_sum 14)," \
  "/dev/shm files left $(col_sum 15)"
if [ "$failures" -eq 0 ] && [ "$keep" -eq 0 ]; then
  rm -rf "$out"
else
  echo "kill_test: results in $tsv"
fi
[ "$failures" -eq 0 ]
