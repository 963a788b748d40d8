#!/usr/bin/env bash
# Compares libmwms's all_reduce_perf with Intel MPI 2021.18's MPI_Allreduce on this host, at n = 2
# and 4. A bench-time comparison only: Intel MPI is fetched from PyPI into a throw-away venv and is
# never a dependency of libmwms or of its tests.
#
# Intel MPI runs with I_MPI_FABRICS=shm (shared memory only, one host) and
# I_MPI_ADJUST_ALLREDUCE=13, timing bench/impi/impi_allreduce.c (compiled with Intel MPI's mpicc)
# which measures like all_reduce_perf: in place, float32 sum, medians, max over ranks. libmwms runs
# under Open MPI's mpirun with --compare mpi (so Open MPI's numbers come along), glibc keeping
# freed memory for Open MPI's sake (see bench/run_performance.sh).
#
# Usage: bench/compare_impi.sh [-d DIR] [-B BIN_DIR] [-k BACKEND] [-r REPEATS] [-b MINBYTES]
#                              [-e MAXBYTES] [-n ITERS] [-w WARMUP] [-c COMPARE]
#   -d DIR      output directory (default perf-results/impi-<UTC date>)
#   -B BIN_DIR  the *_perf binaries (default build/bin)
#   -k BACKEND  libmwms --backend (default auto, what users get)
#   -r N        repetitions (default 3); -b MINBYTES (default 8), -e MAXBYTES (default 64M),
#               powers of two, 4x apart
#   -n ITERS    timed iterations per size (default 20); -w WARMUP untimed ones (default 5)
#   -c COMPARE  all_reduce_perf's --compare (default mpi: Open MPI in the same run, iterations
#               interleaved, so each call also waits out the peer's skew from the other
#               library's call). For 4 B - 4 KiB use -b 4 -e 4K -n 3000 -w 200 -c none: at
#               0.3 us a size needs thousands of iterations, and back-to-back calls are what
#               impi_allreduce times
#   -h, --help  this text
# Environment: IMPI_VENV (default /tmp/impi) is created if missing.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
out="" bin="$repo/build/bin" backend=auto repeats=3 minb=8 maxb=64M iters=20 warmup=5 compare=mpi
# --help/-h: the usage above, status 0; an unknown option or a missing value: the usage on stderr,
# status 2.
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
bad_usage() { echo "compare_impi.sh: $1" >&2; usage >&2; exit 2; }
while getopts ":d:B:k:r:b:e:n:w:c:h-:" opt; do
  case $opt in
    d) out=$OPTARG ;; B) bin=$OPTARG ;; k) backend=$OPTARG ;; r) repeats=$OPTARG ;;
    b) minb=$OPTARG ;; e) maxb=$OPTARG ;; n) iters=$OPTARG ;; w) warmup=$OPTARG ;;
    c) compare=$OPTARG ;;
    h) usage; exit 0 ;;
    -) [ "$OPTARG" = help ] || bad_usage "unknown option --$OPTARG"; usage; exit 0 ;;
    :) bad_usage "option -$OPTARG needs a value" ;;
    *) bad_usage "unknown option -$OPTARG" ;;
  esac
done
shift $((OPTIND - 1))
[ $# -eq 0 ] || bad_usage "unexpected argument '$1' (this script takes options only)"
[ -n "$out" ] || out="$repo/perf-results/impi-$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$out"
venv=${IMPI_VENV:-/tmp/impi}
case $maxb in
  *G) max_bytes=$(( ${maxb%G} << 30 )) ;; *M) max_bytes=$(( ${maxb%M} << 20 )) ;;
  *K) max_bytes=$(( ${maxb%K} << 10 )) ;; *) max_bytes=$maxb ;;
esac

# 1. Intel MPI from PyPI (impi-devel: headers, mpicc; impi-rt: libmpi, mpirun).
if [ ! -x "$venv/bin/mpicc" ]; then
  echo "installing Intel MPI into $venv (python3 -m venv + pip install impi-devel impi-rt)"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet impi-devel==2021.18.* impi-rt==2021.18.* ||
    { echo "compare_impi.sh: pip could not install impi-devel/impi-rt (PyPI unreachable?)"; exit 2; }
fi
# Intel MPI's environment only for its own commands: its bin/ has an mpirun and its lib/ a
# libfabric, which must not shadow Open MPI's for the libmwms runs.
impi_env=(env I_MPI_ROOT="$venv" PATH="$venv/bin:$PATH"
          LD_LIBRARY_PATH="$venv/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
impi_mpirun="$venv/bin/mpirun"
[ -x "$impi_mpirun" ] || impi_mpirun="$venv/bin/mpiexec.hydra"
# Intel's mpicc calls gcc by default (I_MPI_CC); its include/lib paths come from I_MPI_ROOT.
"${impi_env[@]}" "$venv/bin/mpicc" -O2 -o "$out/impi_allreduce" "$here/impi/impi_allreduce.c" ||
  { echo "compare_impi.sh: Intel MPI's mpicc failed"; exit 2; }
echo "Intel MPI: $("${impi_env[@]}" "$impi_mpirun" --version 2>/dev/null | head -1)"

# 2. The runs: Intel MPI alone, then libmwms + Open MPI (each repetition alternating, so that a
# noisy phase of the machine does not land on one side only).
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
cores=$(nproc)
status=0
for np in 2 4; do
  ompi=(mpirun -np "$np" -x MALLOC_MMAP_MAX_=0 -x MALLOC_TRIM_THRESHOLD_=-1)
  [ "$np" -le "$cores" ] || ompi+=(--oversubscribe)
  for rep in $(seq 1 "$repeats"); do
    name="all_reduce_n${np}_intel-mpi_r${rep}"
    # -bootstrap fork: one host, no ssh; oversubscription is allowed by Intel MPI as is.
    if "${impi_env[@]}" I_MPI_FABRICS=shm I_MPI_ADJUST_ALLREDUCE=13 \
        timeout 600 "$impi_mpirun" -bootstrap fork -n "$np" "$out/impi_allreduce" "$minb" "$max_bytes" 4 "$iters" "$warmup" \
        "$out/$name.json" > "$out/$name.log" 2>&1; then
      echo "ok   $name"
    else
      echo "FAIL $name: $(tail -3 "$out/$name.log" | tr '\n' ' ' | cut -c1-300)"
      rm -f "$out/$name.json"
      status=1
    fi
    name="all_reduce_n${np}_${backend}_r${rep}"
    if MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=-1 timeout 900 "${ompi[@]}" \
        "$bin/all_reduce_perf" -b "$minb" -e "$maxb" -f 4 -n "$iters" -w "$warmup" --backend "$backend" \
        --compare "$compare" --json "$out/$name.json" > "$out/$name.log" 2>&1; then
      echo "ok   $name"
    else
      echo "FAIL $name: $(grep -m1 -iE 'error|failed' "$out/$name.log" | cut -c1-200)"
      # The rows measured before a failed size, kept out of the table's *.json.
      [ ! -f "$out/$name.json" ] || mv "$out/$name.json" "$out/$name.json.partial"
      status=1
    fi
  done
done

# 3. The table: libmwms, Intel MPI and Open MPI busbw side by side ("intel-mpi" is a column of its
# own; its ratio to Open MPI is not measured in one run, so it shows as a dash).
python3 "$here/plot_performance.py" "$out" --markdown "$out/table.md" && cat "$out/table.md"
exit "$status"
