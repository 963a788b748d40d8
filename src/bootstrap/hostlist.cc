// Note [slurm hostlist]: Slurm writes node lists compactly (SLURM_JOB_NODELIST, SLURM_STEP_NODELIST):
// comma-separated items at top level, each a host name in which bracket groups "[lo-hi,n,...]"
// stand for decimal ranges. Zero padding belongs to the range ("[08-10]" is 08 09 10), and a name
// may hold several groups ("rack[1-2]n[01-02]"), which multiply like Slurm's multi-dimensional
// lists. Commas inside brackets separate ranges, outside brackets they separate names. Everything
// is counted before anything is generated, so a hostile "[0-999999999]" fails fast instead of
// allocating: names are capped at kMaxSlurmNodes and each at kMaxHostNameBytes.
#include "bootstrap/hostlist.h"

#include <algorithm>
#include <cctype>
#include <string>

#include "mwms/errors.h"

namespace mwms::bootstrap {

namespace {

[[noreturn]] void fail(std::string_view where, std::string_view text, const std::string& why) {
  std::string shown(text.substr(0, 200));
  if (text.size() > 200) shown += "...";
  throw BootstrapError(std::string(where) + "=\"" + shown + "\" is not a Slurm " +
                       (where.find("TASKS") != std::string_view::npos ? "task count list"
                                                                      : "host list") +
                       ": " + why);
}

bool host_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '-' || c == '.' || c == '_';
}

// A decimal of at most 9 digits (no sign, no spaces).
bool parse_decimal(std::string_view s, long* out) {
  if (s.empty() || s.size() > 9) return false;
  long v = 0;
  for (char c : s) {
    if (std::isdigit(static_cast<unsigned char>(c)) == 0) return false;
    v = v * 10 + (c - '0');
  }
  *out = v;
  return true;
}

struct Range {
  long lo = 0;
  long hi = 0;
  std::size_t width = 0;  // digits of the low bound: the padding of every number in the range
};

// One piece of a name: literal text, or a bracket group (a list of ranges).
struct Piece {
  std::string literal;
  std::vector<Range> ranges;  // empty for a literal
  std::size_t count() const {
    std::size_t n = 0;
    for (const Range& r : ranges) n += static_cast<std::size_t>(r.hi - r.lo + 1);
    return n;
  }
};

std::vector<Range> parse_group(std::string_view group, std::string_view where,
                               std::string_view text) {
  std::vector<Range> out;
  std::size_t start = 0;
  while (start <= group.size()) {
    std::size_t comma = group.find(',', start);
    std::string_view item = group.substr(start, comma == std::string_view::npos ? comma : comma - start);
    std::size_t dash = item.find('-');
    std::string_view lo_text = item.substr(0, dash);
    std::string_view hi_text = dash == std::string_view::npos ? lo_text : item.substr(dash + 1);
    Range r;
    if (!parse_decimal(lo_text, &r.lo) || !parse_decimal(hi_text, &r.hi)) {
      fail(where, text, "\"[" + std::string(group) + "]\" holds \"" + std::string(item) +
                            "\", not a number or a range lo-hi of decimal numbers");
    }
    if (r.hi < r.lo) {
      fail(where, text, "range \"" + std::string(item) + "\" runs backwards");
    }
    if (static_cast<std::size_t>(r.hi - r.lo) >= kMaxSlurmNodes) {
      fail(where, text, "range \"" + std::string(item) + "\" names more than " +
                            std::to_string(kMaxSlurmNodes) + " hosts");
    }
    r.width = lo_text.size();
    out.push_back(r);
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

// Splits one top-level item into literal pieces and bracket groups.
std::vector<Piece> parse_item(std::string_view item, std::string_view where, std::string_view text) {
  std::vector<Piece> pieces;
  std::size_t i = 0;
  while (i < item.size()) {
    if (item[i] == '[') {
      std::size_t close = item.find(']', i);
      std::size_t nested = item.find('[', i + 1);
      if (close == std::string_view::npos || (nested != std::string_view::npos && nested < close)) {
        fail(where, text, "unbalanced or nested '[' in \"" + std::string(item) + "\"");
      }
      Piece p;
      p.ranges = parse_group(item.substr(i + 1, close - i - 1), where, text);
      pieces.push_back(std::move(p));
      i = close + 1;
      continue;
    }
    if (item[i] == ']') fail(where, text, "']' without '[' in \"" + std::string(item) + "\"");
    if (!host_char(item[i])) {
      fail(where, text, std::string("character '") + item[i] + "' cannot be part of a host name");
    }
    if (pieces.empty() || !pieces.back().ranges.empty()) pieces.emplace_back();
    pieces.back().literal += item[i++];
  }
  return pieces;
}

// Appends every name of `pieces` (leftmost group slowest) to `out`.
void generate(const std::vector<Piece>& pieces, std::size_t index, std::string& prefix,
              std::vector<std::string>* out) {
  if (index == pieces.size()) {
    out->push_back(prefix);
    return;
  }
  const Piece& p = pieces[index];
  std::size_t keep = prefix.size();
  if (p.ranges.empty()) {
    prefix += p.literal;
    generate(pieces, index + 1, prefix, out);
  } else {
    for (const Range& r : p.ranges) {
      for (long v = r.lo; v <= r.hi; ++v) {
        std::string digits = std::to_string(v);
        if (digits.size() < r.width) prefix.append(r.width - digits.size(), '0');
        prefix += digits;
        generate(pieces, index + 1, prefix, out);
        prefix.resize(keep);
      }
    }
  }
  prefix.resize(keep);
}

}  // namespace

std::vector<std::string> expand_hostlist(std::string_view text, std::string_view where) {
  if (text.size() > kMaxHostListBytes) {
    fail(where, text, "longer than " + std::to_string(kMaxHostListBytes) + " bytes");
  }
  if (text.empty()) fail(where, text, "empty");
  // Top-level items: commas outside brackets.
  std::vector<std::string_view> items;
  int depth = 0;
  std::size_t start = 0;
  for (std::size_t i = 0; i <= text.size(); ++i) {
    if (i < text.size() && text[i] == '[') ++depth;
    if (i < text.size() && text[i] == ']') --depth;
    if (depth < 0) fail(where, text, "']' without '['");
    if (depth > 1) fail(where, text, "nested brackets");
    if (i == text.size() || (text[i] == ',' && depth == 0)) {
      if (i == text.size() && depth != 0) fail(where, text, "'[' without ']'");
      if (i == start) fail(where, text, "an empty host name (two commas, or one at an end)");
      items.push_back(text.substr(start, i - start));
      start = i + 1;
    }
  }
  std::vector<std::vector<Piece>> parsed;
  std::size_t total = 0;
  for (std::string_view item : items) {
    std::vector<Piece> pieces = parse_item(item, where, text);
    std::size_t count = 1;
    std::size_t length = 0;
    for (const Piece& p : pieces) {
      if (p.ranges.empty()) {
        length += p.literal.size();
        continue;
      }
      count *= p.count();  // each factor < kMaxSlurmNodes; checked below before overflow matters
      std::size_t widest = 0;
      for (const Range& r : p.ranges) {
        widest = std::max<std::size_t>({widest, r.width, std::to_string(r.hi).size()});
      }
      length += widest;
      if (count > kMaxSlurmNodes) break;
    }
    total += count;
    if (count > kMaxSlurmNodes || total > kMaxSlurmNodes) {
      fail(where, text, "names more than " + std::to_string(kMaxSlurmNodes) + " hosts");
    }
    if (length > kMaxHostNameBytes) {
      fail(where, text, "\"" + std::string(item.substr(0, 80)) + "\" gives a host name longer than " +
                            std::to_string(kMaxHostNameBytes) + " bytes");
    }
    parsed.push_back(std::move(pieces));
  }
  std::vector<std::string> out;
  out.reserve(total);
  for (const auto& pieces : parsed) {
    std::string prefix;
    generate(pieces, 0, prefix, &out);
  }
  return out;
}

std::vector<int> parse_tasks_per_node(std::string_view text, std::string_view where) {
  if (text.size() > kMaxHostListBytes) {
    fail(where, text, "longer than " + std::to_string(kMaxHostListBytes) + " bytes");
  }
  if (text.empty()) fail(where, text, "empty");
  std::vector<int> out;
  long total = 0;
  std::size_t start = 0;
  while (true) {
    std::size_t comma = text.find(',', start);
    std::string_view item =
        text.substr(start, comma == std::string_view::npos ? comma : comma - start);
    std::size_t paren = item.find('(');
    long tasks = 0;
    long repeat = 1;
    if (!parse_decimal(item.substr(0, paren), &tasks) || tasks < 1) {
      fail(where, text, "\"" + std::string(item) + "\" is not a task count >= 1 (N or N(xM))");
    }
    if (paren != std::string_view::npos) {
      std::string_view rest = item.substr(paren);
      if (rest.size() < 4 || rest.substr(0, 2) != "(x" || rest.back() != ')' ||
          !parse_decimal(rest.substr(2, rest.size() - 3), &repeat) || repeat < 1) {
        fail(where, text, "\"" + std::string(item) + "\" is not N(xM) with M >= 1");
      }
    }
    if (static_cast<std::size_t>(repeat) > kMaxSlurmNodes - out.size()) {
      fail(where, text, "describes more than " + std::to_string(kMaxSlurmNodes) + " nodes");
    }
    if (tasks > kMaxSlurmTasks || tasks * repeat > kMaxSlurmTasks - total) {
      fail(where, text, "describes more than " + std::to_string(kMaxSlurmTasks) + " tasks");
    }
    total += tasks * repeat;
    out.insert(out.end(), static_cast<std::size_t>(repeat), static_cast<int>(tasks));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

}  // namespace mwms::bootstrap
