// Range checks of the bench tools' numeric flags, one message shape for all of them: the flag
// (its short and long spelling), the value given and the rule, e.g. "-c/--check 2: must be 0 or 1".
// Header-only so that reduce_kernel_perf, which links the kernels' objects rather than libmwms,
// uses the same checks. CLI11's own range validators are not used: their message quotes the type's
// whole range ("not in range 0.000000 to 1797693...") and an unsigned option silently wraps a
// negative value ("-t -1" became 18446744073709551615), so each flag is read into a signed or
// floating type and checked here.
#pragma once

#include <sstream>
#include <string>
#include <string_view>

#include "mwms/errors.h"

namespace mwms::bench {

namespace detail {
template <typename T>
[[noreturn]] void refuse_flag(std::string_view flag, T value, std::string_view rule) {
  std::ostringstream text;
  text << flag << " " << value << ": must be " << rule;
  throw InvalidArgument(text.str());
}
}  // namespace detail

/// A 0/1 flag (nccl-tests' -c): @throws mwms::InvalidArgument naming `flag` and `value` unless
/// it is 0 or 1. Thread-safe.
inline void check_flag_0_or_1(std::string_view flag, long long value) {
  if (value != 0 && value != 1) detail::refuse_flag(flag, value, "0 or 1");
}

/// @throws mwms::InvalidArgument naming `flag` and `value` unless value >= min. Thread-safe.
inline void check_flag_at_least(std::string_view flag, long long value, long long min) {
  if (value < min) detail::refuse_flag(flag, value, ">= " + std::to_string(min));
}

/// @throws mwms::InvalidArgument naming `flag` and `value` unless value > min (NaN fails).
/// Thread-safe.
inline void check_flag_above(std::string_view flag, double value, double min) {
  if (!(value > min)) {
    std::ostringstream rule;
    rule << "> " << min;
    detail::refuse_flag(flag, value, rule.str());
  }
}

}  // namespace mwms::bench
