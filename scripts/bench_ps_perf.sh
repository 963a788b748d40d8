#!/usr/bin/env bash
# The ps_perf comparison of docs/parameter_server.md, "Measured": push + pull of train's MLP
# (814,120 bytes) per step, 2 workers + 1 ps over shared memory, asynchronous and synchronous,
# interleaved with all_reduce_perf on the same bytes and 2 ranks, RUNS times; prints each run's
# times and the medians' ratios.
# Usage: scripts/bench_ps_perf.sh [RUNS] [BUILD_DIR] [ITERS]   (defaults: 5, build, 1000)
set -euo pipefail
runs=${1:-5}
build=${2:-build}
iters=${3:-1000}
if ! [[ $runs =~ ^[1-9][0-9]*$ && $iters =~ ^[1-9][0-9]*$ ]] || [ ! -x "$build/bin/ps_perf" ]; then
  echo "Usage: scripts/bench_ps_perf.sh [RUNS] [BUILD_DIR] [ITERS] (BUILD_DIR/bin/ps_perf built)" >&2
  exit 2
fi
time_of() {  # column COMMAND...: the 814120-byte row's time in us, from rank 0's output
  local col=$1
  shift
  "$@" 2>&1 | awk -v c="$col" '$1 == "[0]" && $2 == "814120" { print $c }'
}
async=() sync=() ar=()
for i in $(seq 1 "$runs"); do
  a=$(time_of 4 "$build/bin/mwmsrun" -np 2 --ps 1 -- "$build/bin/ps_perf" --model mlp -n "$iters" -w 50)
  s=$(time_of 4 "$build/bin/mwmsrun" -np 2 --ps 1 -- "$build/bin/ps_perf" --model mlp --sync -n "$iters" -w 50)
  r=$(time_of 6 "$build/bin/mwmsrun" -np 2 -- "$build/bin/all_reduce_perf" -b 814120 -e 814120 -n "$iters" -w 50)
  [ -n "$a" ] && [ -n "$s" ] && [ -n "$r" ] || { echo "bench_ps_perf.sh: run $i printed no result" >&2; exit 1; }
  echo "run $i: ps-async $a us, ps-sync $s us, all-reduce $r us"
  async+=("$a") sync+=("$s") ar+=("$r")
done
python3 - "${async[*]}" "${sync[*]}" "${ar[*]}" <<'PY'
import statistics, sys
a, s, r = ([float(x) for x in arg.split()] for arg in sys.argv[1:4])
ma, ms, mr = statistics.median(a), statistics.median(s), statistics.median(r)
print(f"medians: ps-async {ma:.1f} us ({ma / mr:.2f}x all-reduce), ps-sync {ms:.1f} us "
      f"({ms / mr:.2f}x), all-reduce {mr:.1f} us")
PY
