#!/usr/bin/env bash
# Open MPI's "rsh agent" for the test hosts in network namespaces (bench/run_netns.sh -m): mpirun
# (running inside the first host's namespace) calls `netns_rsh.sh [options] HOST COMMAND...` to
# start its daemon (orted) on HOST, a test host's address; this runs COMMAND inside that host's
# namespace instead of over ssh. MWMSTEST_HOSTS ("ns=address,...", from tests/tools/netns_hosts.sh)
# maps the address to the namespace. Each daemon also gets a UTS namespace of its own whose host
# name is the namespace's, so that Open MPI sees one node name per test host (they would all share
# this machine's name otherwise).
set -euo pipefail
while [[ ${1:-} == -* ]]; do shift; done  # ssh-style options (-x, -n) that Open MPI may pass
host=${1:?netns_rsh.sh: no host}
shift
ns=""
IFS=, read -ra pairs <<< "${MWMSTEST_HOSTS:?netns_rsh.sh: MWMSTEST_HOSTS is not set}"
for p in "${pairs[@]}"; do
  if [[ ${p#*=} == "$host" || ${p%%=*} == "$host" ]]; then ns=${p%%=*}; fi
done
[[ -n $ns ]] || { echo "netns_rsh.sh: $host is not a test host ($MWMSTEST_HOSTS)" >&2; exit 1; }
exec ip netns exec "$ns" unshare --uts /bin/sh -c "hostname $ns && exec $*"
