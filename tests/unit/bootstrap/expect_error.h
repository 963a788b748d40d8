// Test helper: runs a callable that must throw mwms::BootstrapError and returns what() so the
// caller can check that the message names the entry, task, address and source.
#pragma once

#include <catch2/catch.hpp>
#include <exception>
#include <string>

#include "mwms/errors.h"

namespace mwms::test {

template <typename F>
std::string bootstrap_error(F&& f) {
  try {
    f();
  } catch (const mwms::BootstrapError& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL("expected mwms::BootstrapError, got another exception: " << e.what());
  }
  FAIL("expected mwms::BootstrapError, nothing was thrown");
  return {};
}

}  // namespace mwms::test
