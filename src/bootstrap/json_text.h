// Bounded, total JSON reading for TF_CONFIG and cluster spec files, and quoting of untrusted
// values in error messages. See Note [bounded TF_CONFIG].
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace mwms::bootstrap {

// Note [bounded TF_CONFIG]: TF_CONFIG comes from an operator or a generator we do not control, and
// mwms-doctor exists to diagnose the broken ones, so reading it must be total: every input ends in
// a value or an mwms::Error (never a raw nlohmann exception, a crash or an unbounded allocation),
// and every error text is valid UTF-8 of bounded length so it can be logged, sent to a peer and
// serialised as JSON. The limits are far above any real cluster (the largest TF_CONFIGs seen are
// a few hundred tasks, a few tens of KiB) and well below the rendezvous message cap (4 MiB).
constexpr std::size_t kMaxConfigBytes = 1u << 20;  ///< TF_CONFIG / cluster spec text: 1 MiB
constexpr int kMaxConfigDepth = 16;                ///< nesting of objects/arrays (real: 3)
constexpr std::size_t kMaxConfigValues = 65536;    ///< JSON values in one document
constexpr std::size_t kMaxClusterTasks = 4096;     ///< tasks over all jobs of one cluster
constexpr std::size_t kMaxHostBytes = 253;         ///< RFC 1035/1123 host name
constexpr std::size_t kMaxLabelBytes = 63;         ///< one dot-separated label of a host name
constexpr std::size_t kMaxAddressBytes = 261;      ///< "[" 253-byte host "]:" 5-digit port
constexpr std::size_t kMaxQuotedBytes = 120;       ///< a value quoted in an error message

/// Parses `text` as one JSON document under the limits above. `where` names the source in errors.
/// @throws InvalidArgument for text over kMaxConfigBytes, invalid UTF-8 (naming the byte offset
///   and value in hex), nesting over kMaxConfigDepth, more than kMaxConfigValues values, or a
///   number that does not fit a double (naming its field, e.g. task.index).
/// @throws BootstrapError for malformed JSON (with nlohmann's position).
/// Never throws anything else but std::bad_alloc. Thread-safe (no shared state).
nlohmann::json parse_config_json(std::string_view text, std::string_view where);

/// `text` in double quotes for an error message: control bytes, '"', '\\' and bytes that are not
/// valid UTF-8 are written as \xNN, and text over kMaxQuotedBytes is cut at a character boundary
/// with "... (N bytes)" appended. The result is always valid UTF-8 of bounded size.
std::string quote_value(std::string_view text);

/// As quote_value without the quotes and leaving '"' and '\\' as they are (for JSON excerpts).
std::string printable(std::string_view text);

/// Offset of the first byte of `text` that is not part of valid UTF-8 (RFC 3629: no overlong
/// forms, no surrogates, nothing above U+10FFFF), or npos when all of it is valid.
std::size_t invalid_utf8_offset(std::string_view text) noexcept;

}  // namespace mwms::bootstrap
