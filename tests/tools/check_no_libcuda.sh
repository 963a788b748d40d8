#!/usr/bin/env bash
# unit:no-libcuda — no libmwms binary may depend on libcuda (the driver library): a program with
# libcuda.so.1 in its NEEDED entries cannot start on a machine without a driver, while one that
# links only the CUDA runtime (libcudart) starts and gets cudaErrorInsufficientDriver
# (Note [cuda build] in cmake/mwms_cuda.cmake). With EXPECT_CUDART=1, libcudart must be NEEDED by
# the first file (the library really was built with CUDA).
# Usage: check_no_libcuda.sh EXPECT_CUDART FILE...
set -euo pipefail
expect_cudart=$1
shift
fail=0
for f in "$@"; do
  needed=$(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  if grep -q '^libcuda\.so' <<<"$needed"; then
    echo "FAIL: $f needs the driver library: $(grep '^libcuda\.so' <<<"$needed")"
    fail=1
  fi
done
if [[ "$expect_cudart" == 1 ]] && ! readelf -d "$1" | grep -q 'NEEDED.*libcudart'; then
  echo "FAIL: $1 was built with CUDA but does not need libcudart"
  fail=1
fi
[[ $fail -eq 0 ]] && echo "ok: no libcuda in $# file(s)"
exit $fail
