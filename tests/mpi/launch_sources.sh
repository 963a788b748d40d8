#!/usr/bin/env bash
# Real `mpirun` jobs running mwms-doctor --json (docs/launchers.md): a TF_CONFIG that disagrees
# with mpirun fails on every rank naming both; one that agrees resolves from TF_CONFIG; a PMIx
# rank without any size fails instead of becoming a world of one.
# Usage: launch_sources.sh MPIRUN DOCTOR
set -uo pipefail
mpirun="$1"
doctor="$2"
run() { timeout 120 $mpirun --allow-run-as-root --oversubscribe "$@" 2>/dev/null; }
fail=0
expect() {  # expect NAME PATTERN OUTPUT: every line of OUTPUT contains PATTERN, 2 lines
  local lines
  lines=$(grep -c -- "$2" <<<"$3")
  if [[ "$lines" != 2 ]]; then
    echo "FAIL $1: expected 2 lines with '$2', got:"; echo "$3"; fail=1
  else
    echo "ok $1"
  fi
}
one='{"cluster":{"worker":["127.0.0.1:1"]},"task":{"type":"worker","index":0}}'
out=$(run -np 2 -x TF_CONFIG="$one" "$doctor" --json)
expect "1-worker TF_CONFIG under -np 2" \
  '"error":"TF_CONFIG lists 1 worker but mpirun started 2 processes (OMPI_COMM_WORLD_SIZE=2)' "$out"
three='{"cluster":{"worker":["127.0.0.1:1","127.0.0.1:2","127.0.0.1:3"]},"task":{"type":"worker","index":0}}'
out=$(run -np 2 -x TF_CONFIG="$three" "$doctor" --json)
expect "3-worker TF_CONFIG under -np 2" 'TF_CONFIG lists 3 workers but mpirun started 2' "$out"
# Agreeing: each rank's TF_CONFIG names its own index.
out=$(run -np 2 sh -c 'TF_CONFIG="{\"cluster\":{\"worker\":[\"127.0.0.1:1\",\"127.0.0.1:2\"]},\"task\":{\"type\":\"worker\",\"index\":$OMPI_COMM_WORLD_RANK}}" exec "$0" --json' "$doctor")
expect "agreeing TF_CONFIG" '"num_workers":2,"ring":\["127.0.0.1:1","127.0.0.1:2"\],"source":"tf_config"' "$out"
out=$(run -np 2 env -u OMPI_COMM_WORLD_SIZE -u OMPI_COMM_WORLD_RANK "$doctor" --json)
expect "PMIX_RANK without a size" '"error":"a PMIx launcher started this process (PMIX_RANK=' "$out"
exit $fail
