// An assertion for a test's worker threads. Catch2 v2's CHECK/REQUIRE are not thread-safe (their
// counters and the current result are shared: a data race under TSan), so a thread calls
// expect(), which throws, catches the exception at its top, records the message, and the main
// thread asserts on what was recorded after joining.
#pragma once

#include <stdexcept>
#include <string>

namespace mwms::testing {

/// Throws std::runtime_error("expected " + what) unless `ok`. Thread-safe (touches nothing
/// shared).
inline void expect(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("expected " + what);
}

}  // namespace mwms::testing
