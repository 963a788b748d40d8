#!/usr/bin/env bash
# Runs the suite under sanitizers (docs/testing.md, "Sanitizers"):
#   asan  AddressSanitizer + UndefinedBehaviorSanitizer (errors fatal) over the unit and
#         multi-process suites (labels unit, tcp), in build-asan/;
#   tsan  ThreadSanitizer over what runs threads: the asynchronous collectives (Work and the
#         progress thread), finalize, the heartbeat thread, the overlapped gradient sync,
#         the threaded algorithm tests over in-memory links and the NCCL backend and replica
#         group over the fake NCCL (ranks as threads), in build-tsan/.
# MPI is off in these builds (Open MPI's own allocations and threads are not ours to check).
# Usage: scripts/run_sanitizers.sh [asan] [tsan]   (both by default). Exit status: 0 when every
# selected run passed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
kinds=("$@")
[ ${#kinds[@]} -gt 0 ] || kinds=(asan tsan)
jobs=$(nproc)
status=0
for kind in "${kinds[@]}"; do
  case $kind in
    asan) san=address,undefined; flags=-fno-sanitize-recover=undefined
          select=(-L "unit|tcp" -LE "netns") ;;
    tsan) san=thread; flags=""
          select=(-R "Work|async|finalize|overlap|threaded ranks|progress thread|poisoned|compression|TRACE_FILE|heartbeat|stall warning|flight recorder|local replica|GPU replicas|nccl replica group|nccl backend") ;;
    *) echo "run_sanitizers.sh: unknown kind $kind (asan, tsan)" >&2; exit 2 ;;
  esac
  dir=build-$kind
  echo "run_sanitizers.sh: $kind: building $dir"
  mkdir -p "$dir"
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMWMS_SANITIZE="$san" \
    -DCMAKE_CXX_FLAGS="$flags" -DMWMS_WITH_MPI=OFF -DMWMS_WITH_CUDA=OFF -DMWMS_BUILD_BENCH=OFF \
    > "$dir/configure.log" 2>&1 || { cat "$dir/configure.log"; exit 1; }
  cmake --build "$dir" -j"$jobs" > "$dir/build.log" 2>&1 || { tail -40 "$dir/build.log"; exit 1; }
  echo "run_sanitizers.sh: $kind: testing"
  if ! ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
       TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
       ctest --test-dir "$dir" --output-on-failure -j1 --timeout 900 "${select[@]}"; then
    status=1
  fi
done
exit $status
