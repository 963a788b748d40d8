#!/usr/bin/env bash
# unit:public-api-documented: runs Doxygen on the configured Doxyfile (docs/Doxyfile.in:
# WARN_IF_UNDOCUMENTED, WARN_AS_ERROR=FAIL_ON_WARNINGS, warnings into a log) and fails, listing
# every warning, when a public declaration of include/mwms (or the generated config.h/version.h)
# is undocumented or a doc comment is malformed.
# Usage: check_docs.sh DOXYGEN DOXYFILE WARNINGS_LOG
set -uo pipefail
doxygen="$1" doxyfile="$2" log="$3"
rm -f "$log"
out=$(cd "$(dirname "$doxyfile")" && "$doxygen" "$(basename "$doxyfile")" 2>&1)
rc=$?
if [[ $rc -ne 0 || -s "$log" ]]; then
  echo "public-api-documented: doxygen exited $rc; every public declaration in include/mwms needs a"
  echo "/// docstring (shapes, units, blocking and thread safety, errors thrown). Warnings:"
  [[ -s "$log" ]] && cat "$log"
  [[ -n "$out" ]] && echo "$out"
  exit 1
fi
echo "public-api-documented: no Doxygen warnings"
