// Bounded JSON reading (Note [bounded TF_CONFIG]): a SAX handler that builds the DOM while
// counting depth and values and tracking the path of the value being read, so that a number that
// overflows is reported as "task.index" rather than as nlohmann's bare out_of_range.406.
#include "bootstrap/json_text.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "mwms/errors.h"

namespace mwms::bootstrap {

namespace {

using json = nlohmann::json;

// Length of the valid UTF-8 sequence starting at text[i], 0 when it is not valid.
std::size_t utf8_sequence(std::string_view text, std::size_t i) noexcept {
  auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[k]); };
  unsigned char c = byte(i);
  if (c < 0x80) return 1;
  std::size_t n = 0;
  unsigned char lo = 0x80;
  unsigned char hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;  // overlong
    if (c == 0xED) hi = 0x9F;  // surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;  // overlong
    if (c == 0xF4) hi = 0x8F;  // above U+10FFFF
  } else {
    return 0;
  }
  if (i + n > text.size()) return 0;
  if (byte(i + 1) < lo || byte(i + 1) > hi) return 0;
  for (std::size_t k = 2; k < n; ++k) {
    if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return 0;
  }
  return n;
}

std::string hex_byte(unsigned char c) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "\\x%02X", c);
  return buf;
}

// Builds the DOM like nlohmann's own parser, within the limits; stops at the first violation.
class BoundedDom {
 public:
  bool null() { return put(nullptr); }
  bool boolean(bool value) { return put(value); }
  bool number_integer(json::number_integer_t value) { return put(value); }
  bool number_unsigned(json::number_unsigned_t value) { return put(value); }
  bool number_float(json::number_float_t value, const json::string_t& /*text*/) {
    return put(value);
  }
  bool string(json::string_t& value) { return put(std::move(value)); }
  bool binary(json::binary_t& value) { return put(json::binary(std::move(value))); }
  bool start_object(std::size_t /*size*/) { return open(json::object()); }
  bool start_array(std::size_t /*size*/) { return open(json::array()); }
  bool key(json::string_t& name) {
    stack_.back().key = name;
    stack_.back().has_key = true;
    return true;
  }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool parse_error(std::size_t position, const std::string& token,
                   const nlohmann::detail::exception& error) {
    error_position_ = position;
    error_token_ = token;
    error_id_ = error.id;
    error_text_ = error.what();
    return false;
  }

  json& root() { return root_; }
  const std::string& limit_error() const { return limit_error_; }
  int error_id() const { return error_id_; }
  std::size_t error_position() const { return error_position_; }
  const std::string& error_token() const { return error_token_; }
  const std::string& error_text() const { return error_text_; }

  // "cluster.worker[1]": the value being read now ("the document" at the top).
  std::string path() const {
    std::string out;
    for (const Frame& frame : stack_) {
      if (frame.node->is_object() && !frame.has_key) continue;  // between members
      if (frame.node->is_array()) {
        out += "[" + std::to_string(frame.node->size()) + "]";
      } else {
        out += (out.empty() ? "" : ".") + quote_if_needed(frame.key);
      }
    }
    return out.empty() ? "the document" : out;
  }

 private:
  struct Frame {
    json* node;
    std::string key;  // objects: the key of the value being read
    bool has_key = false;  // objects: `key` names a value not yet complete
  };

  static std::string quote_if_needed(const std::string& key) {
    bool plain = !key.empty() && key.size() <= 64 &&
                 key.find_first_not_of(
                     "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                     "0123456789_-") == std::string::npos;
    return plain ? key : quote_value(key);
  }

  bool count() {
    if (++values_ > kMaxConfigValues) {
      limit_error_ = "holds more than " + std::to_string(kMaxConfigValues) + " JSON values (at " +
                     path() + "); a cluster has at most " + std::to_string(kMaxClusterTasks) +
                     " tasks";
      return false;
    }
    return true;
  }

  // Where a new value goes; nullptr for the root.
  json* slot() {
    if (stack_.empty()) return &root_;
    Frame& top = stack_.back();
    if (top.node->is_array()) {
      top.node->push_back(nullptr);
      return &top.node->back();
    }
    return &(*top.node)[top.key];
  }

  template <typename V>
  bool put(V&& value) {
    if (!count()) return false;
    *slot() = json(std::forward<V>(value));
    if (!stack_.empty()) stack_.back().has_key = false;
    return true;
  }

  bool open(json container) {
    if (!count()) return false;
    if (static_cast<int>(stack_.size()) >= kMaxConfigDepth) {
      limit_error_ = "nests objects and arrays deeper than " + std::to_string(kMaxConfigDepth) +
                     " levels (at " + path() + "); a TF_CONFIG needs 3";
      return false;
    }
    // The parent does not grow while this child is open, so the pointer stays valid.
    json* node = slot();
    *node = std::move(container);
    stack_.push_back(Frame{node, {}});
    return true;
  }

  bool close() {
    stack_.pop_back();
    if (!stack_.empty()) stack_.back().has_key = false;
    return true;
  }

  json root_;
  std::vector<Frame> stack_;
  std::size_t values_ = 0;
  std::string limit_error_;
  int error_id_ = 0;
  std::size_t error_position_ = 0;
  std::string error_token_;
  std::string error_text_;
};

}  // namespace

std::size_t invalid_utf8_offset(std::string_view text) noexcept {
  for (std::size_t i = 0; i < text.size();) {
    std::size_t n = utf8_sequence(text, i);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

namespace {

// Escapes control bytes, invalid UTF-8 (and, when `quotes`, '"' and '\\') as \xNN; cuts at `limit`.
std::string clean_text(std::string_view text, std::size_t limit, bool quotes) {
  std::string out;
  std::size_t i = 0;
  while (i < text.size() && out.size() < limit) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    std::size_t n = utf8_sequence(text, i);
    if (n == 0 || c < 0x20 || c == 0x7F || (quotes && (c == '"' || c == '\\'))) {
      out += hex_byte(c);
      i += 1;
    } else {
      out.append(text.data() + i, n);
      i += n;
    }
  }
  if (i < text.size()) out += "... (" + std::to_string(text.size()) + " bytes)";
  return out;
}

}  // namespace

std::string printable(std::string_view text) { return clean_text(text, kMaxQuotedBytes, false); }

std::string quote_value(std::string_view text) {
  std::string body = clean_text(text, kMaxQuotedBytes, true);
  if (text.size() > kMaxQuotedBytes) {
    std::size_t cut = body.rfind("... (");
    if (cut != std::string::npos) return "\"" + body.substr(0, cut) + "\"" + body.substr(cut);
  }
  return "\"" + body + "\"";
}

json parse_config_json(std::string_view text, std::string_view where) {
  const std::string source(where);
  if (text.size() > kMaxConfigBytes) {
    throw InvalidArgument(source + ": the text is " + std::to_string(text.size()) +
                          " bytes, above the limit of " + std::to_string(kMaxConfigBytes) +
                          " bytes (1 MiB) for a TF_CONFIG or cluster spec");
  }
  std::size_t bad = invalid_utf8_offset(text);
  if (bad != std::string_view::npos) {
    throw InvalidArgument(
        source + ": byte " + std::to_string(bad) + " (" +
        hex_byte(static_cast<unsigned char>(text[bad])) +
        ") is not valid UTF-8; TF_CONFIG must be UTF-8 JSON (the text before it: " +
        printable(text.substr(bad > 40 ? bad - 40 : 0, bad > 40 ? 40 : bad)) + ")");
  }
  BoundedDom dom;
  bool ok = false;
  try {
    ok = json::sax_parse(text.begin(), text.end(), &dom);
  } catch (const json::exception& e) {
    // The SAX parser reports through parse_error; this is only a guard for totality.
    throw BootstrapError(source + ": malformed JSON (" + clean_text(e.what(), 400, false) + ")");
  }
  if (ok) return std::move(dom.root());
  if (!dom.limit_error().empty()) throw InvalidArgument(source + ": the JSON " + dom.limit_error());
  if (dom.error_id() == 406) {
    throw InvalidArgument(source + ": the number " + quote_value(dom.error_token()) + " at " +
                          dom.path() + " (byte " + std::to_string(dom.error_position()) +
                          ") does not fit a 64-bit floating-point number");
  }
  // nlohmann's position is the byte after the last one it read (its "last read" may hold more
  // than the bad token): name the bad token's first byte (counted from 1), found by walking back
  // to the structural character or space before it, and what would have been valid there.
  const std::size_t end = std::min(dom.error_position(), text.size());
  std::size_t start = end;
  constexpr std::string_view kBefore = "{}[],: \t\r\n";
  if (end >= 2 && text[end - 1] == '"') {
    // A whole string was read: its opening quote (a ':' or ',' inside it is not structural).
    std::size_t q = end - 1;
    while (q > 0 && (text[q - 1] != '"' || (q >= 2 && text[q - 2] == '\\'))) --q;
    start = q > 0 ? q - 1 : 0;
  } else {
    while (start > 0 && kBefore.find(text[start - 1]) == std::string_view::npos) --start;
  }
  const bool at_end = dom.error_position() > text.size() ||
                      dom.error_text().find("unexpected end of input") != std::string::npos;
  if (at_end) start = text.size();
  if (start == end && start > 0 && !at_end) --start;  // the bad byte is itself structural
  const std::string_view token = text.substr(start, end > start ? end - start : 0);
  std::string expected = "a JSON value";
  if (text.substr(0, start).find_first_not_of(" \t\r\n") == std::string_view::npos) {
    expected = "a JSON object ({\"cluster\": ..., \"task\": ...} or a job map)";
  } else if (std::size_t at = dom.error_text().find("; expected "); at != std::string::npos) {
    expected = clean_text(dom.error_text().substr(at + 11), 200, false);
  }
  const std::string found = at_end || token.empty() ? "the end of the text" : quote_value(token);
  // nlohmann's own text repeats what is said here; only where in the document it happened is
  // added (the path of the value being read).
  const std::size_t line_start = text.substr(0, start).rfind('\n');
  const std::size_t line =
      1 + static_cast<std::size_t>(std::count(text.begin(), text.begin() + start, '\n'));
  const std::size_t column = line_start == std::string_view::npos ? start + 1 : start - line_start;
  throw BootstrapError(source + ": malformed JSON: expected " + expected + " at byte " +
                       std::to_string(start + 1) + ", found " + found + " (line " +
                       std::to_string(line) + ", column " + std::to_string(column) + ", in " +
                       dom.path() + ")");
}

}  // namespace mwms::bootstrap
