#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz with clang (ASan + UBSan, -DMWMS_FUZZ=ON) into
# build-fuzz/ and runs each for a bounded time from its seed corpus (tests/fuzz/corpus/<target>;
# new inputs go to a scratch copy, not into the repository). A finding stops with the fuzzer's
# report and the input in build-fuzz/findings/<target>/: add that file to the corpus, fix the
# bug, and the ordinary build replays it from then on (unit:fuzz-corpus:<target>).
#
# Targets run nproc at a time: each fuzzer is one process, so with a core each every target still
# gets its SECONDS of a core, in a fraction of the wall time.
# Usage: scripts/run_fuzz.sh [SECONDS_PER_TARGET (default 30)] [TARGET...]
# Skips (exit 0, with a message) when clang++ or libFuzzer is missing; CI runs it when clang is
# there (.ci/run).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
seconds=${1:-30}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(tf_config peer_info frame checkpoint handshake ps_description ps_checkpoint)
command -v clang++ > /dev/null || { echo "run_fuzz.sh: skipped: no clang++ (Debian package clang)"; exit 0; }
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' > "$probe/p.cc"
if ! clang++ -fsanitize=fuzzer "$probe/p.cc" -o "$probe/p" 2> /dev/null; then
  echo "run_fuzz.sh: skipped: clang++ has no libFuzzer (Debian package libclang-rt-14-dev)"; exit 0
fi
mkdir -p build-fuzz
cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
  -DCMAKE_CXX_COMPILER=clang++ -DMWMS_FUZZ=ON -DMWMS_SANITIZE=address,undefined \
  -DCMAKE_CXX_FLAGS=-fno-sanitize-recover=undefined -DMWMS_WITH_MPI=OFF -DMWMS_WITH_CUDA=OFF \
  -DMWMS_BUILD_BENCH=OFF -DMWMS_BUILD_EXAMPLES=OFF > build-fuzz/configure.log 2>&1 ||
  { cat build-fuzz/configure.log; exit 1; }
cmake --build build-fuzz -j"$(nproc)" --target $(printf 'fuzz_%s ' "${targets[@]}") > build-fuzz/build.log 2>&1 ||
  { tail -30 build-fuzz/build.log; exit 1; }
jobs=$(nproc)
status=0
for ((i = 0; i < ${#targets[@]}; i += jobs)); do
  batch=("${targets[@]:i:jobs}")
  pids=()
  for t in "${batch[@]}"; do
    work=build-fuzz/corpus/$t findings=build-fuzz/findings/$t
    rm -rf "$work" && mkdir -p "$work" "$findings"
    cp tests/fuzz/corpus/"$t"/* "$work"/
    echo "run_fuzz.sh: $t for $seconds s"
    build-fuzz/bin/fuzz_"$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
      -max_len=65536 -artifact_prefix="$findings/" -print_final_stats=1 "$work" \
      > build-fuzz/"$t".log 2>&1 &
    pids+=($!)
  done
  for k in "${!batch[@]}"; do
    t=${batch[$k]}
    if ! wait "${pids[$k]}"; then
      echo "run_fuzz.sh: FINDING in $t (input in build-fuzz/findings/$t/):"; tail -40 build-fuzz/"$t".log
      status=1
    else
      echo "run_fuzz.sh: $t: $(grep -E "stat::number_of_executed_units|stat::peak_rss_mb" build-fuzz/"$t".log | tr '\n' ' ')"
    fi
  done
done
exit $status
