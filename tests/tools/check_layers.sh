#!/usr/bin/env bash
# Checks the dependency rule of DESIGN.md / STYLE items 1, 2 and 4 on the source tree:
#   common <- kernels <- collective; common <- bootstrap <- collective <- strategy
# (a layer includes only its own headers and those of the layers below it), algorithms never
# include a transport, transports never include an algorithm or the engine, and MWMS_HAVE_*
# conditionals appear only in registry/selector files and in a backend's or transport's own
# directory. Prints every violation and exits 1 if there is one.
set -euo pipefail
src="${1:-$(dirname "$0")/../../src}"
fail=0
allowed() {  # layer -> space-separated layers it may include
  case "$1" in
    common) echo "common" ;;
    kernels) echo "common kernels" ;;
    bootstrap) echo "common bootstrap" ;;
    collective) echo "common kernels bootstrap collective" ;;
    strategy) echo "common kernels bootstrap collective strategy" ;;
  esac
}
for layer in common kernels bootstrap collective strategy; do
  ok=" $(allowed "$layer") "
  while IFS=: read -r file line inc; do
    target=$(sed -E 's/.*#include "([a-z_]+)\/.*/\1/' <<<"$inc")
    [[ "$target" == mwms ]] && continue   # public headers
    if [[ "$ok" != *" $target "* ]]; then
      echo "layering: $file:$line includes $target/ (a $layer file may include: $(allowed "$layer"))"
      fail=1
    fi
  done < <(grep -rnE '#include "[a-z_]+/' "$src/$layer" || true)
done
# Algorithms see plans, never transports; transports see links, never algorithms or the engine.
if grep -rnE '#include "collective/(transport|engine|backend)/' "$src/collective/algorithms"; then
  echo "layering: an algorithm includes a transport, engine or backend header"; fail=1
fi
if grep -rnE '#include "collective/(algorithms|engine|backend)/' "$src/collective/transport"; then
  echo "layering: a transport includes an algorithm, engine or backend header"; fail=1
fi
# The strategy holds a Communicator and the collective layer's faces (device_group.h), never a
# backend (docs/architecture.md "Strategy").
if grep -rnE '#include "collective/backend/' "$src/strategy"; then
  echo "layering: the strategy includes a collective backend header (use collective/device_group.h)"; fail=1
fi
# Note [transport table]: the socket mesh and the selector never name a transport.
if grep -rnE '#include "collective/transport/' "$src/collective/mesh" "$src/collective/selector.cc"; then
  echo "layering: the socket mesh or the selector includes a transport header"; fail=1
fi
# Feature conditionals only where STYLE item 4 allows them.
while IFS=: read -r file line _; do
  case "$file" in
    */registry.cc|*/selector.cc|*/transport/mpi/*|*/transport/nccl/*|*/backend/nccl*|*/kernels/cuda/*|*/bootstrap/mpi_*) ;;
    *) echo "feature #if outside a registry or backend directory: $file:$line"; fail=1 ;;
  esac
done < <(grep -rnE '#\s*if.*MWMS_HAVE_' "$src" || true)
if [[ $fail -eq 0 ]]; then echo "layers ok"; fi
exit $fail
