#!/usr/bin/env bash
# Runs the bench tools for every libmwms backend beside Open MPI (--compare mpi, same buffers, same
# run) at several rank counts on this host, and writes one --json file (and its log) per run into a
# directory; bench/plot_performance.py turns that directory into the tables and the plot of
# docs/PERFORMANCE.md. Open MPI runs at its best: glibc is told to keep freed memory
# (MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=-1), because MPI_Allreduce mallocs a message-sized
# temporary per call and first-touching fresh pages costs ~11 us per 4 KiB here.
#
# A backend that cannot start (shm or mpi before their transports exist, mpi in a build without
# MPI) is reported and skipped; the other runs go on. The exit status is 0 when at least one run
# per rank count succeeded.
#
# Usage: bench/run_performance.sh [options] [-- extra flags for the *_perf tools]
#   -d DIR      output directory (default perf-results/<UTC date>-<host>)
#   -B DIR      directory of the *_perf binaries (default build/bin)
#   -n "2 4"    rank counts (more ranks than cores get --oversubscribe)
#   -k "auto tcp shm mpi"   backends (--backend values)
#   -t "all_reduce"         tools (all_reduce all_gather reduce_scatter broadcast)
#   -r 3        repetitions of each run (the plot takes medians over them)
#   -b 8 -e 64M -f 4 -i 20 -w 5   sizes and iterations (the tools' -b -e -f -n -w)
#   -h, --help  this text (an unknown option: this text on stderr, exit status 2)
# Example: bench/run_performance.sh -d /tmp/perf && python3 bench/plot_performance.py /tmp/perf
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
out="" bin="$repo/build/bin" ranks="2 4" backends="auto tcp shm mpi" tools="all_reduce"
repeats=3 minb=8 maxb=64M factor=4 iters=20 warmup=5
# --help/-h: the usage above, status 0; an unknown option or a missing value: the usage on stderr,
# status 2.
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
bad_usage() { echo "run_performance.sh: $1" >&2; usage >&2; exit 2; }
while getopts ":d:B:n:k:t:r:b:e:f:i:w:h-:" opt; do
  case $opt in
    d) out=$OPTARG ;; B) bin=$OPTARG ;; n) ranks=$OPTARG ;; k) backends=$OPTARG ;;
    t) tools=$OPTARG ;; r) repeats=$OPTARG ;; b) minb=$OPTARG ;; e) maxb=$OPTARG ;;
    f) factor=$OPTARG ;; i) iters=$OPTARG ;; w) warmup=$OPTARG ;;
    h) usage; exit 0 ;;
    -) [ "$OPTARG" = help ] || bad_usage "unknown option --$OPTARG"; usage; exit 0 ;;
    :) bad_usage "option -$OPTARG needs a value" ;;
    *) bad_usage "unknown option -$OPTARG" ;;
  esac
done
shift $((OPTIND - 1))
extra=("$@")
[ -n "$out" ] || out="$repo/perf-results/$(date -u +%Y%m%dT%H%M%SZ)-$(hostname -s)"
mkdir -p "$out"
command -v mpirun > /dev/null || { echo "run_performance.sh: mpirun not found (Open MPI)"; exit 2; }
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export MWMS_CONNECT_TIMEOUT_SECONDS=${MWMS_CONNECT_TIMEOUT_SECONDS:-30}
export MWMS_TIMEOUT_SECONDS=${MWMS_TIMEOUT_SECONDS:-120}
cores=$(nproc)

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(hostname -s), $(uname -srm), $cores cores"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
  echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "libmwms: $(git -C "$repo" describe --always --dirty 2>/dev/null || echo unknown)"
  echo "mpirun: $(mpirun --version 2>/dev/null | head -1)"
  echo "flags: -b $minb -e $maxb -f $factor -n $iters -w $warmup ${extra[*]:-}"
} > "$out/machine.txt"
cat "$out/machine.txt"

failed=() ok_ranks=()
for np in $ranks; do
  launch=(mpirun -np "$np" -x MALLOC_MMAP_MAX_=0 -x MALLOC_TRIM_THRESHOLD_=-1)
  [ "$np" -le "$cores" ] || launch+=(--oversubscribe)
  any_ok=0
  for tool in $tools; do
    for backend in $backends; do
      for rep in $(seq 1 "$repeats"); do
        name="${tool}_n${np}_${backend}_r${rep}"
        # MALLOC_* also in our own environment, so the tool's banner reports what its ranks got.
        if MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=-1 timeout 900 "${launch[@]}" \
            "$bin/${tool}_perf" -b "$minb" -e "$maxb" -f "$factor" -n "$iters" -w "$warmup" \
            --backend "$backend" --compare mpi --json "$out/$name.json" "${extra[@]}" \
            > "$out/$name.log" 2>&1; then
          echo "ok   $name: $(grep -m1 '^# Backend:' "$out/$name.log" | sed 's/^# Backend: //')"
          any_ok=1
        else
          # The rows measured before a failed size, kept out of the plot's *.json.
          [ ! -f "$out/$name.json" ] || mv "$out/$name.json" "$out/$name.json.partial"
          echo "FAIL $name: $(grep -m1 -E 'Error|error|failed|MWMS_TRANSPORT' "$out/$name.log" \
            | cut -c1-200)"
          failed+=("$name")
          break  # the next repetitions of a backend that cannot start would fail alike
        fi
      done
    done
  done
  [ "$any_ok" -eq 0 ] || ok_ranks+=("$np")
done

echo "results in $out (${#failed[@]} failed: ${failed[*]:-none})"
echo "tables and plot: python3 $here/plot_performance.py $out --png $out/busbw.png"
[ "${#ok_ranks[@]}" -eq "$(wc -w <<< "$ranks")" ]
