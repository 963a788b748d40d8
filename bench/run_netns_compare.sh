#!/usr/bin/env bash
# libmwms beside Open MPI's TCP transport and Gloo on the same links (issue 9): for each rate and
# host count, one mpirun job across test hosts in network namespaces (bench/run_netns.sh -m, one
# rank per host) runs all_reduce_perf --compare mpi,gloo, so the three implementations are timed
# in the same run on the same buffers (libmwms's TCP, Open MPI's btl tcp, Gloo's tcp transport,
# all on the veth). Writes one --json file and log per run into a directory, with machine.txt (the
# load before each run); bench/plot_netns.py turns the directory into the table and the plot of
# docs/PERFORMANCE.md.
#
# Usage (root): bench/run_netns_compare.sh [-d DIR] [-r "1gbit 10gbit"] [-H "2 4"] [-s "1"] \
#                 [-b 1M] [-e 256M] [-f 4] [-i 5] [-w 1] [-- extra all_reduce_perf flags]
#   -s "1 2 4"  MWMS_NSOCKS_PERPEER values (libmwms's TCP streams per peer), one run each
#   -h, --help  this text
# Example: bench/run_netns_compare.sh -d /tmp/netns && python3 bench/plot_netns.py /tmp/netns
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
out="" rates="1gbit 10gbit" hosts="2 4" streams="1" minb=1M maxb=256M factor=4 iters=5 warmup=1
# --help/-h: the usage above, status 0; an unknown option or a missing value: the usage on stderr,
# status 2.
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
bad_usage() { echo "run_netns_compare.sh: $1" >&2; usage >&2; exit 2; }
while getopts ":d:r:H:s:b:e:f:i:w:h-:" opt; do
  case $opt in
    d) out=$OPTARG ;; r) rates=$OPTARG ;; H) hosts=$OPTARG ;; s) streams=$OPTARG ;;
    b) minb=$OPTARG ;; e) maxb=$OPTARG ;; f) factor=$OPTARG ;; i) iters=$OPTARG ;;
    w) warmup=$OPTARG ;;
    h) usage; exit 0 ;;
    -) [ "$OPTARG" = help ] || bad_usage "unknown option --$OPTARG"; usage; exit 0 ;;
    :) bad_usage "option -$OPTARG needs a value" ;;
    *) bad_usage "unknown option -$OPTARG" ;;
  esac
done
shift $((OPTIND - 1))
[ "${1:-}" != "--" ] || shift
[ -n "$out" ] || out="$repo/perf-results/netns-$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$out"
export MWMS_CONNECT_TIMEOUT_SECONDS=${MWMS_CONNECT_TIMEOUT_SECONDS:-60}
export MWMS_TIMEOUT_SECONDS=${MWMS_TIMEOUT_SECONDS:-300}
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(hostname -s), $(uname -srm), $(nproc) cores"
  echo "libmwms: $(git -C "$repo" describe --always --dirty 2>/dev/null || echo unknown)"
  echo "mpirun: $(mpirun --version 2>/dev/null | head -1)"
  echo "flags: -b $minb -e $maxb -f $factor -n $iters -w $warmup --compare mpi,gloo $*"
} > "$out/machine.txt"
cat "$out/machine.txt"
status=0
for rate in $rates; do
  for h in $hosts; do
    for k in $streams; do
      name="netns-$rate-${h}hosts-${k}streams"
      echo "$name: load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/machine.txt"
      if ! MWMS_NSOCKS_PERPEER=$k OUT="$out/$name.ranks" "$here/run_netns.sh" -H "$h" -r "$rate" -m -- \
          -b "$minb" -e "$maxb" -f "$factor" -n "$iters" -w "$warmup" --compare mpi,gloo \
          --json "$out/$name.json" "$@" > "$out/$name.log" 2>&1; then
        # The rows measured before a failed size, kept out of plot_netns.py's *.json.
        [ ! -f "$out/$name.json" ] || mv "$out/$name.json" "$out/$name.json.partial"
        echo "$name: FAILED (see $out/$name.log)"; status=1; continue
      fi
      grep -E "^ +[0-9]+ " "$out/$name.log" | sed "s/^/$name /"
    done
  done
done
exit $status
