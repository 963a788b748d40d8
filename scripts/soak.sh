#!/usr/bin/env bash
# The full soak (docs/RELIABILITY.md "Soak"): 10,000 random collectives on 4 processes, every
# result verified, resident memory flat after the warm-up. Under mpirun (when Open MPI is
# installed) the 4 ranks hold 20 communicators at once: tcp, shm, auto and mpi x auto, ring,
# gather, rd and rhd; with --fork (or without mpirun) mwms_soak forks the ranks itself and the
# mpi transport is left out. Prints mwms_soak's summary and writes it as JSON to
# build/soak.json. Takes ~10-20 minutes on 2 shared cores.
#
# Usage: scripts/soak.sh [--fork] [--build DIR] [mwms_soak options, e.g. --collectives 2000]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=build fork=0
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --fork) fork=1; shift ;;
    --build) [ $# -ge 2 ] || { echo "soak.sh: --build needs a directory" >&2; exit 2; }
      build=$2; shift 2 ;;
    -h|--help)
      sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
      [ -x "$build/bin/mwms_soak" ] && { echo; echo "mwms_soak options:"; "$build/bin/mwms_soak" --help; }
      exit 0 ;;
    *) args+=("$1"); shift ;;
  esac
done
soak=$build/bin/mwms_soak
[ -x "$soak" ] || { echo "soak.sh: build $soak first (cmake --build $build --target mwms_soak)"; exit 2; }
common=(--collectives 10000 --max-bytes 4M --seed 2026 --json "$build/soak.json" --progress)
if [ "$fork" -eq 0 ] && command -v mpirun > /dev/null; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  exec mpirun -np 4 --oversubscribe --bind-to none "$soak" "${common[@]}" \
    --transports tcp,shm,auto,mpi "${args[@]}"
fi
exec "$soak" --ranks 4 "${common[@]}" "${args[@]}"
