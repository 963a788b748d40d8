#include "collective/option_values.h"

#include <mutex>
#include <set>

#include "common/env.h"
#include "common/logging.h"

namespace mwms::collective {

namespace {

// Note [option sentinels]: once per field and process, so a loop that builds options does not
// flood the log; a field's later uses read the same way silently.
void warn_sentinel(const char* field, const char* spelled, const char* env_name) noexcept {
  try {
    static std::mutex mu;
    static std::set<std::string> warned;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!warned.insert(field).second) return;
    }
    MWMS_LOG_WARN(kEnv, field << " = " << spelled << " meaning \"read " << env_name
                              << "\" is deprecated and goes in the next release: leave the field "
                                 "unset (std::nullopt; None in Python) instead");
  } catch (...) {  // a warning that cannot be written must not fail the call
  }
}

}  // namespace

double seconds_option(const std::optional<double>& value, const char* field, const char* env_name) {
  if (value && *value > 0) return *value;
  if (value) warn_sentinel(field, "0 (or less)", env_name);
  return common::env_double(env_name);
}

double seconds_or(const std::optional<double>& value, double fallback, const char* field) noexcept {
  if (value && *value > 0) return *value;
  if (value) warn_sentinel(field, "0 (or less)", "the collective's own timeout");
  return fallback;
}

long long bytes_option(const std::optional<std::size_t>& value, const char* field,
                       const char* env_name) {
  if (bytes_option_set(value)) return static_cast<long long>(*value);
  if (value) warn_sentinel(field, "0", env_name);
  return common::env_int(env_name);
}

bool bytes_option_set(const std::optional<std::size_t>& value) noexcept {
  return value && *value > 0;
}

long long small_message_option(const std::optional<long long>& value) {
  if (value && *value >= 0) return *value;
  if (value) {
    warn_sentinel("CommunicatorOptions::small_message_bytes", "-1", "MWMS_SMALL_MESSAGE_BYTES");
  }
  return common::env_int("MWMS_SMALL_MESSAGE_BYTES");
}

std::string algorithm_option(const std::optional<std::string>& value) {
  if (value && !value->empty()) return *value;
  if (value) warn_sentinel("CommunicatorOptions::algorithm", "\"\"", "MWMS_ALGO");
  return common::env_string("MWMS_ALGO");
}

std::optional<TransportChoice> transport_option(const std::optional<TransportChoice>& value,
                                                const char* field) noexcept {
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  if (value != TransportChoice::kFromEnvironment) return value;
#pragma GCC diagnostic pop
  warn_sentinel(field, "TransportChoice::kFromEnvironment", "MWMS_TRANSPORT");
  return std::nullopt;
}

}  // namespace mwms::collective
