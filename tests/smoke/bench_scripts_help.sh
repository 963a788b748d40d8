#!/usr/bin/env bash
# The bench's shell scripts that take options answer --help and -h with their usage (status 0)
# and refuse an unknown option, long or short, and a missing value with the usage on stderr
# (status 2), before they start anything. Usage: bench_scripts_help.sh BENCH_DIR
set -uo pipefail
bench=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=0
fail() { echo "FAIL $1"; failed=1; }
for script in run_performance.sh compare_impi.sh run_netns.sh run_netns_compare.sh; do
  for help in --help -h; do
    out=$(timeout 30 bash "$bench/$script" "$help" 2> "$work/err")
    status=$?
    [ "$status" -eq 0 ] || fail "$script $help: status $status"
    grep -q "Usage" <<< "$out" || fail "$script $help: no usage on stdout: $out"
  done
  for bad in --no-such-option -Z -d; do
    # -d takes a value in every script but run_netns.sh, where it is unknown: both exit 2.
    timeout 30 bash "$bench/$script" "$bad" > "$work/out" 2> "$work/err"
    status=$?
    [ "$status" -eq 2 ] || fail "$script $bad: status $status, not 2"
    grep -q "^$script: .*${bad#--}" "$work/err" || fail "$script $bad: no reason: $(cat "$work/err")"
    grep -q "Usage" "$work/err" || fail "$script $bad: no usage on stderr"
    [ ! -s "$work/out" ] || fail "$script $bad: wrote to stdout: $(head -3 "$work/out")"
  done
  echo "ok $script"
done
exit "$failed"
