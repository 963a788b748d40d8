// The text of a failure held in a std::exception_ptr, for messages that carry an earlier failure
// (a poisoned communicator's cause, a shutdown's warning).
#pragma once

#include <exception>
#include <string>

namespace mwms::common {

/// What the exception `e` holds says: its what(); "an exception that is not a std::exception"
/// for anything else; "" for a null `e`. Throws only std::bad_alloc.
inline std::string exception_text(const std::exception_ptr& e) {
  if (!e) return "";
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

}  // namespace mwms::common
