#!/usr/bin/env bash
# Runs the suite under sanitizers (docs/testing.md, "Sanitizers"):
#   asan  AddressSanitizer + UndefinedBehaviorSanitizer (errors fatal) over the unit and
#         multi-process suites (labels unit, tcp), in build-asan/;
#   tsan  ThreadSanitizer over what runs threads: the asynchronous collectives (Work and the
#         progress thread), finalize, the heartbeat thread, the overlapped gradient sync,
#         the threaded algorithm tests over in-memory links and the NCCL backend and replica
#         group over the fake NCCL (ranks as threads), in build-tsan/.
# MPI is off in these builds (Open MPI's own allocations and threads are not ours to check).
# Each build compiles only the binaries its selected tests run (not the bench, not `train`: no
# selected test starts them) at -O1 with line tables only (-g1): reports keep function, file and
# line, and the build takes about half the time of -O2 -g. A test binary that is not built shows up
# in `ctest -N` as <target>_NOT_BUILT; the script fails then, naming it (add it to the list below).
# Usage: scripts/run_sanitizers.sh [asan] [tsan]   (both by default). Exit status: 0 when every
# selected run passed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
kinds=("$@")
[ ${#kinds[@]} -gt 0 ] || kinds=(asan tsan)
jobs=$(nproc)
opt_flags="-O1 -g1 -DNDEBUG"   # CMAKE_CXX_FLAGS_RELWITHDEBINFO (CMake's default: -O2 -g -DNDEBUG)
# Checks of sources, docs and link dependencies that run no instrumented code of ours (the
# Release run has them): not repeated under a sanitizer.
not_instrumented="^unit:(layering|public-api-documented|no-libcuda)$"
status=0
for kind in "${kinds[@]}"; do
  dir=build-$kind
  case $kind in
    asan) san=address,undefined; flags=-fno-sanitize-recover=undefined
          # The examples stay on: the unit tests of train's checkpoint format, CNN gradient and
          # GPU-model maths compile examples/train sources into mwms_unit_tests.
          examples=ON
          select=(-L "unit|tcp" -LE "netns" -E "$not_instrumented")
          # reliability:kills runs mwms_kill_worker and mwmsrun from the build (kill_test.sh
          # skips, exit 77, without them); unit:fuzz-corpus:* the fuzz_replay_* binaries.
          targets=(mwms_unit_tests mwms_multiproc_tests mwms_soak mwms_kill_worker mwmsrun) ;;
    tsan) san=thread; flags=""
          examples=OFF  # no selected test is one of train's (tests/unit/train)
          select=(-R "Work|async|finalize|overlap|threaded ranks|progress thread|poisoned|compression|TRACE_FILE|heartbeat|stall warning|flight recorder|local replica|GPU replicas|nccl replica group|nccl backend")
          targets=(mwms_unit_tests mwms_multiproc_tests) ;;
    *) echo "run_sanitizers.sh: unknown kind $kind (asan, tsan)" >&2; exit 2 ;;
  esac
  echo "run_sanitizers.sh: $kind: building $dir"
  mkdir -p "$dir"
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMWMS_SANITIZE="$san" \
    -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$opt_flags" \
    -DMWMS_WITH_MPI=OFF -DMWMS_WITH_CUDA=OFF -DMWMS_BUILD_BENCH=OFF \
    -DMWMS_BUILD_EXAMPLES="$examples" > "$dir/configure.log" 2>&1 ||
    { cat "$dir/configure.log"; exit 1; }
  if [ "$kind" = asan ]; then  # one replay binary per fuzz target (tests/fuzz/CMakeLists.txt)
    mapfile -t replays < <(grep -o 'fuzz_replay_[A-Za-z0-9_]*' "$dir/tests/fuzz/CTestTestfile.cmake" | sort -u)
    [ ${#replays[@]} -gt 0 ] || { echo "run_sanitizers.sh: no fuzz_replay_* in $dir/tests/fuzz" >&2; exit 1; }
    targets+=("${replays[@]}")
  fi
  start=$SECONDS
  cmake --build "$dir" -j"$jobs" --target "${targets[@]}" > "$dir/build.log" 2>&1 ||
    { tail -40 "$dir/build.log"; exit 1; }
  echo "run_sanitizers.sh: $kind: built in $((SECONDS - start)) s"
  not_built=$(ctest --test-dir "$dir" -N | grep -o '[A-Za-z0-9_]*_NOT_BUILT' | sort -u || true)
  if [ -n "$not_built" ]; then
    echo "run_sanitizers.sh: $kind: test binaries not built (add them to targets):" $not_built >&2
    exit 1
  fi
  echo "run_sanitizers.sh: $kind: testing"
  if ! ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
       TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
       ctest --test-dir "$dir" --output-on-failure -j1 --timeout 900 "${select[@]}"; then
    status=1
  fi
done
exit $status
