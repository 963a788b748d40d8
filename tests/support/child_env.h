// An MWMS_* variable set inside one child of run_ranks (multiproc/launcher.h). The env registry
// (src/common/env.cc) reads each variable once per process, so a value set after forking reaches
// the library only when this test binary had not read the variable before the fork: a ctest run
// gives every test case its own process; a run of several cases in one process must skip the
// case rather than test the old value.
#pragma once

#include <catch2/catch.hpp>

#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "common/env.h"
#include "multiproc/launcher.h"

namespace mwms::testing {

/// In a child of run_ranks: sets `name` to `value` and returns true when the env registry sees
/// `value`; otherwise reports "cached: this test binary read NAME before forking" through
/// `report` and returns false (the child should return; the parent then skips with
/// skipped_for_cached_env()). @throws what common::env_string throws (InvalidArgument when
/// `value` does not parse as the variable's type).
inline bool set_env_in_child(const char* name, const std::string& value,
                             const std::function<void(const std::string&)>& report) {
  ::setenv(name, value.c_str(), 1);
  if (common::env_string(name) == value) return true;
  report(std::string("cached: this test binary read ") + name + " before forking");
  return false;
}

/// After run_ranks: true, with a Catch2 warning, when rank 0 reported set_env_in_child()'s
/// "cached: " (the case must run in a process of its own, as ctest runs it).
inline bool skipped_for_cached_env(const std::vector<ChildResult>& results) {
  if (results.empty() || results[0].output.find("cached: ") == std::string::npos) return false;
  WARN("skipped: run this test case in its own process (ctest does)");
  return true;
}

}  // namespace mwms::testing
