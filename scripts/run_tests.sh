#!/usr/bin/env bash
# The test job: install dependencies, build (same build/ as run_main.sh), run every CTest test,
# then build the Python package into a venv (build/venv) and run its pytest suite
# (docs/python.md). Fails when either fails (pytest's "no tests collected" included).
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
ctest_status=0
ctest --test-dir build --output-on-failure -j1 --timeout 600 || ctest_status=$?

# The Python package: `pip install ./python` (scikit-build-core + nanobind from PyPI compile the
# extension against this repository's CMake targets, in python/build/), then its tests, the
# Spark runner's on a real Spark among them.
python_start=$SECONDS
python_status=0
python_tests() {  # (set -e does not apply inside a function called before ||: each step says)
  local venv=build/venv pip=(build/venv/bin/python -m pip install --quiet --disable-pip-version-check)
  [[ -x $venv/bin/python ]] || python3 -m venv "$venv" || return
  "${pip[@]}" pytest numpy ml_dtypes || return
  # mwms.spark's tests (python/tests/test_spark.py) start a real Spark: pyspark from PyPI (its
  # jars included) on the JVM of setup.sh's openjdk-17-jre-headless.
  local spark_start=$SECONDS
  "${pip[@]}" "pyspark>=3.5" || return
  echo "run_tests.sh: pyspark install took $((SECONDS - spark_start)) s"
  # PyTorch CPU tensors (test_multiprocess.py::test_torch_cpu_tensors): torch from PyPI, whose
  # Linux wheel brings the CUDA libraries it links (~3 GB download, ~5 GB in the venv, 1-2 min;
  # no pip cache kept). MWMS_TEST_TORCH=0 leaves it out: that test is then skipped, saying why.
  if [[ ${MWMS_TEST_TORCH:-1} != 0 ]]; then
    local torch_start=$SECONDS
    # A failed install (no disk for it, the index unreachable) is said loudly and the suite goes
    # on: pytest's summary (-rs) then lists that test as skipped, with the reason.
    if "${pip[@]}" --no-cache-dir torch; then
      echo "run_tests.sh: torch install took $((SECONDS - torch_start)) s"
    else
      echo "run_tests.sh: WARNING: torch could not be installed; the PyTorch test is skipped"
    fi
  fi
  CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} "${pip[@]}" ./python || return
  # From build/, so that `import mwms` finds the installed package, not the sources in python/.
  # Any non-zero status fails the job, 5 (no test collected) too.
  (cd build && venv/bin/python -m pytest -q -rs -p no:cacheprovider ../python/tests)
}
python_tests || python_status=$?
echo "run_tests.sh: Python package build and tests took $((SECONDS - python_start)) s" \
  "(exit $python_status)"

if [[ $ctest_status -ne 0 ]]; then
  exit "$ctest_status"
fi
exit "$python_status"
