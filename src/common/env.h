// The one registry of MWMS_* environment variables (STYLE item 24): each is declared once in
// env.cc with its type, default and help, read once at first use and immutable afterwards.
// docs/env.md is checked against this registry by tests/unit/common/env_test.cc.
#pragma once

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

/// Effective value (environment or default) of a registered variable, read once per process.
/// @throws InternalError if `name` is not registered; InvalidArgument if the value does not parse.
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

}  // namespace mwms::common
