#!/usr/bin/env bash
# smoke:gpu-bench-args — mwms_gpu_bench's command line, checked without a GPU (it parses its
# arguments before it looks for a device): --help prints the usage and exits 0, a bad or unknown
# argument exits 2 naming it, and a good command line on a machine without a device exits 77.
# Usage: gpu_bench_args.sh MWMS_GPU_BENCH
set -uo pipefail
bench=$1
fail() { echo "FAIL: $*"; exit 1; }
out=$("$bench" --help 2>&1); rc=$?
[[ $rc -eq 0 ]] || fail "--help exit $rc"
grep -q "vs_copy" <<<"$out" || fail "--help does not explain vs_copy: $out"
for args in "--iters x" "--iters 0" "--max-bytes -5" "--max-bytes 1024" "--bogus" "--iters"; do
  out=$("$bench" $args 2>&1); rc=$?
  [[ $rc -eq 2 ]] || fail "'$args' exit $rc, expected 2: $out"
  grep -q "^mwms_gpu_bench: " <<<"$out" || fail "'$args' gave no message: $out"
done
out=$("$bench" --max-bytes 1048576 --iters 1 2>&1); rc=$?
if [[ $rc -eq 77 ]]; then
  grep -q "SKIPPED: no CUDA device" <<<"$out" || fail "exit 77 without saying why: $out"
else
  [[ $rc -eq 0 ]] || fail "a good command line exited $rc: $out"
  grep -q '"bench":"memcpy_d2d"' <<<"$out" || fail "no device-copy line: $out"
fi
echo "ok mwms_gpu_bench parses its arguments before looking for a device"
