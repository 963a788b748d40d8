// The one registry of MWMS_* environment variables (STYLE item 24): each is declared once in
// env.cc with its type, default and help, read once at first use and immutable afterwards.
// docs/env.md is checked against this registry by tests/unit/common/env_test.cc.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace mwms::common {

enum class EnvType { kInt, kDouble, kString, kEnum };

struct EnvVarInfo {
  const char* name;
  EnvType type;
  const char* default_value;
  const char* allowed;  // for kEnum: '|'-separated values; otherwise a short range description
  const char* help;
};

/// Every registered variable, in documentation order.
const std::vector<EnvVarInfo>& env_registry();

/// The bounds an EnvVarInfo::allowed text of a number states: "> 0", ">= 4096", "1-16" or
/// "1..65535" (inclusive); text after a ';' is a remark and ignored. A text of another form
/// gives no bound (valid() false).
struct EnvRange {
  bool has_lo = false, lo_strict = false, has_hi = false;
  double lo = 0, hi = 0;
  bool valid() const noexcept { return has_lo || has_hi; }
  bool contains(double v) const noexcept {
    return (!has_lo || (lo_strict ? v > lo : v >= lo)) && (!has_hi || v <= hi);
  }
};
EnvRange env_range(const char* allowed) noexcept;

/// `value` of the kInt or kDouble variable `var` as a number, checked against the range its
/// `allowed` text states (env_range). Never reads the environment.
/// @throws InvalidArgument "NAME=VALUE is not an integer (allowed: ...)", "... is not a number
///   (allowed: ...)" or "NAME=VALUE is out of range (allowed: ...)".
double parse_env_number(const EnvVarInfo& var, const std::string& value);

/// Effective value (environment or default) of a registered variable, read once per process.
/// @throws InternalError if `name` is not registered; InvalidArgument if the value does not parse
///   or (numbers) lies outside the registered range (parse_env_number).
std::string env_string(std::string_view name);
long long env_int(std::string_view name);
double env_double(std::string_view name);
/// Whether a registered variable is present (and not empty) in the environment, as read once
/// with its value: tells "left at its default" from "set to the default's value".
/// @throws InternalError if `name` is not registered; InvalidArgument as env_string.
bool env_is_set(std::string_view name);

/// Whether a registered variable is in the environment at all, even with an empty value (for
/// variables where an empty value is an error rather than "unset"). Throws as env_is_set.
bool env_is_present(std::string_view name);

/// The effective value to print in logs: the value, except for secrets (MWMS_AUTH_KEY), shown
/// as "(set, not shown)" or empty. Throws as env_string.
std::string env_value_for_log(std::string_view name);

/// MWMS_* variables present in the environment that the registry does not know (typos).
std::vector<std::string> unknown_env_vars();

/// Every registered variable set in the environment now whose value would be refused when read
/// (an enum value not allowed, a number that does not parse or is out of its range): the
/// messages env_int / env_double / env_string would throw, in registry order. Reads the
/// environment directly (not the once-per-process cache); for tools that check a setup
/// (mwms-doctor). A string variable whose values a higher layer owns (MWMS_TRANSPORT: the
/// transport table) is checked by `check_string`, when given: it returns "" for a value it takes,
/// else the message. Never throws except std::bad_alloc.
std::vector<std::string> env_problems(
    const std::function<std::string(const EnvVarInfo& var, const std::string& value)>&
        check_string = {});

}  // namespace mwms::common
