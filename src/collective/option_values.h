// The values of the options structs' optional fields (Note [option sentinels], mwms/options.h):
// the field when set, else its environment variable; the deprecated sentinels of 0.x read as
// unset, each logged once per process at warn naming the field.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include "mwms/options.h"

namespace mwms::collective {

/// A duration option in seconds: `value` when set and > 0, else the double variable `env_name`
/// (docs/env.md). A set value <= 0 is the deprecated "unset". `field` ("CommunicatorOptions::
/// timeout_seconds") names it in the warning. Thread-safe. @throws InvalidArgument (a malformed
/// variable, as common::env_double).
double seconds_option(const std::optional<double>& value, const char* field, const char* env_name);

/// A duration given to a call rather than set in an options struct (Work::wait's limit):
/// `value` when set and > 0, else `fallback`; a set value <= 0 is the deprecated "unset".
/// Thread-safe. Never throws.
double seconds_or(const std::optional<double>& value, double fallback, const char* field) noexcept;

/// A byte-size option: `value` when set and > 0, else the integer variable `env_name`. A set 0
/// is the deprecated "unset". Thread-safe. @throws InvalidArgument (as common::env_int).
long long bytes_option(const std::optional<std::size_t>& value, const char* field,
                       const char* env_name);

/// True when `value` is set to a value that is not a deprecated sentinel (> 0): what "the caller
/// chose a chunk" means where that changes more than the value (MPI's piece size).
bool bytes_option_set(const std::optional<std::size_t>& value) noexcept;

/// CommunicatorOptions::small_message_bytes: the value when set and >= 0, else
/// MWMS_SMALL_MESSAGE_BYTES; a set negative value is the deprecated "unset". Thread-safe.
long long small_message_option(const std::optional<long long>& value);

/// CommunicatorOptions::algorithm: the name when set and not empty, else MWMS_ALGO ("" when that
/// is unset too); a set empty string is the deprecated "unset". Not validated here.
std::string algorithm_option(const std::optional<std::string>& value);

/// An options struct's transport with TransportChoice::kFromEnvironment (deprecated) read as
/// unset: std::nullopt means MWMS_TRANSPORT. `field` names it in the warning. Never throws.
std::optional<TransportChoice> transport_option(const std::optional<TransportChoice>& value,
                                                const char* field) noexcept;

}  // namespace mwms::collective
