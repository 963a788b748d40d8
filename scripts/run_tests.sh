#!/usr/bin/env bash
# The test job: install dependencies, build (same build/ as run_main.sh), run every CTest test.
# Exits with ctest's status.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# The MPI tests start `mpirun`, which refuses to run as root unless told that it is intended
# (containers and CI machines usually run as root).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

bash scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j2
# -j1: multi-process tests bind loopback ports and share 2 cores; in parallel they time out.
# --timeout: a hung test fails after 10 minutes instead of blocking the job.
ctest --test-dir build --output-on-failure -j1 --timeout 600
