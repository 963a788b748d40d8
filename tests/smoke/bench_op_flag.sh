#!/usr/bin/env bash
# -o/--op is taken by the tools that reduce and refused, with a reason and exit status 2, by those
# that do not (it used to be accepted and silently ignored). One process each, no mpirun.
# Usage: bench_op_flag.sh ALL_REDUCE_PERF REDUCE_SCATTER_PERF ALL_GATHER_PERF BROADCAST_PERF
set -euo pipefail
unset TF_CONFIG
tiny=(-b 64 -e 64 -n 1 -w 0)
for perf in "$1" "$2"; do
  out=$("$perf" "${tiny[@]}" -o max 2>&1) || { echo "FAIL: $(basename "$perf") -o max: $out"; exit 1; }
  grep -Eq '^ +64 .* max ' <<<"$out" || { echo "FAIL: no max row: $out"; exit 1; }
  grep -q -- "--op" <<<"$("$perf" --help)" || { echo "FAIL: $(basename "$perf") --help lacks --op"; exit 1; }
  echo "ok $(basename "$perf") takes -o max"
done
for perf in "$3" "$4"; do
  tool=$(basename "$perf")
  for flag in "-o max" "--op sum" "--op=min"; do
    status=0
    # shellcheck disable=SC2086  # the flag and its value are two words
    out=$("$perf" "${tiny[@]}" $flag 2>&1) || status=$?
    [ "$status" -eq 2 ] || { echo "FAIL: $tool $flag: exit status $status: $out"; exit 1; }
    grep -q "$tool takes no reduction op" <<<"$out" || { echo "FAIL: $tool $flag: $out"; exit 1; }
  done
  if grep -q -- "--op" <<<"$("$perf" --help)"; then echo "FAIL: $tool --help lists --op"; exit 1; fi
  "$perf" "${tiny[@]}" > /dev/null || { echo "FAIL: $tool without -o"; exit 1; }
  echo "ok $tool refuses -o: $out"
done
