// The MWMS_* registry is the single source of truth (STYLE item 24): docs/env.md must document
// every registered variable with its default, and the typed getters must return those defaults.
#include "common/env.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "mwms/errors.h"

namespace {

using mwms::common::env_registry;
using mwms::common::EnvType;

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  INFO("reading " << path);
  REQUIRE(in.good());
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

bool is_name_char(char c) {
  return std::isupper(static_cast<unsigned char>(c)) ||
         std::isdigit(static_cast<unsigned char>(c)) || c == '_';
}

// Whole-word match: MWMS_TIMEOUT_SECONDS must not be found inside MWMS_CONNECT_TIMEOUT_SECONDS.
bool mentions(const std::string& line, const std::string& name) {
  for (std::size_t pos = line.find(name); pos != std::string::npos;
       pos = line.find(name, pos + 1)) {
    bool left = pos == 0 || !is_name_char(line[pos - 1]);
    std::size_t end = pos + name.size();
    bool right = end >= line.size() || !is_name_char(line[end]);
    if (left && right) return true;
  }
  return false;
}

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

// The text that documents `name`: from each line mentioning it up to the next line that mentions
// another registered variable (a table row, or a section under a heading).
std::vector<std::string> blocks_for(const std::vector<std::string>& lines,
                                    const std::string& name) {
  std::vector<std::string> blocks;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    if (!mentions(lines[i], name)) continue;
    std::string block = lines[i];
    for (std::size_t j = i + 1; j < lines.size(); ++j) {
      bool other = false;
      for (const auto& var : env_registry()) {
        other = other || (name != var.name && mentions(lines[j], var.name));
      }
      if (other || mentions(lines[j], name)) break;
      block += "\n" + lines[j];
    }
    blocks.push_back(lower(block));
  }
  return blocks;
}

bool documents_default(const std::string& block, const std::string& default_value) {
  if (!default_value.empty()) return block.find(lower(default_value)) != std::string::npos;
  // An empty default has no literal to find; accept the usual ways of writing "nothing".
  for (const char* word : {"empty", "unset", "none", "not set", "\"\"", "``"}) {
    if (block.find(word) != std::string::npos) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("docs/env.md documents every registered variable with its default", "[unit][env]") {
  std::vector<std::string> lines = read_lines(std::string(MWMS_SOURCE_DIR) + "/docs/env.md");
  REQUIRE_FALSE(env_registry().empty());
  for (const auto& var : env_registry()) {
    INFO(var.name << " (default \"" << var.default_value << "\")");
    std::vector<std::string> blocks = blocks_for(lines, var.name);
    CHECK_FALSE(blocks.empty());
    bool found = std::any_of(blocks.begin(), blocks.end(), [&](const std::string& block) {
      return documents_default(block, var.default_value);
    });
    CHECK(found);
  }
}

TEST_CASE("env registry entries are well formed", "[unit][env]") {
  std::vector<std::string> names;
  for (const auto& var : env_registry()) {
    INFO(var.name);
    CHECK(std::string(var.name).rfind("MWMS_", 0) == 0);
    CHECK(std::string(var.help).size() > 10);
    names.emplace_back(var.name);
    if (var.type == EnvType::kEnum) {
      std::string allowed = std::string("|") + var.allowed + "|";
      CHECK(allowed.find(std::string("|") + var.default_value + "|") != std::string::npos);
    }
  }
  std::sort(names.begin(), names.end());
  CHECK(std::adjacent_find(names.begin(), names.end()) == names.end());
}

TEST_CASE("env_int and env_double return the registered defaults", "[unit][env]") {
  int checked = 0;
  for (const auto& var : env_registry()) {
    if (var.type != EnvType::kInt && var.type != EnvType::kDouble) continue;
    INFO(var.name);
    // A value set by whoever runs the tests takes precedence over the default, by design.
    const char* set = std::getenv(var.name);
    std::string expected_text = (set != nullptr && *set != '\0') ? set : var.default_value;
    if (var.type == EnvType::kInt) {
      CHECK(mwms::common::env_int(var.name) == std::stoll(expected_text));
    } else {
      CHECK(mwms::common::env_double(var.name) == Approx(std::stod(expected_text)));
    }
    ++checked;
  }
  CHECK(checked >= 2);
  CHECK_THROWS_AS(mwms::common::env_int("MWMS_NOT_A_VARIABLE"), mwms::InternalError);
}

TEST_CASE("every numeric variable states a range its default lies in", "[unit][env]") {
  int checked = 0;
  for (const auto& var : env_registry()) {
    if (var.type != EnvType::kInt && var.type != EnvType::kDouble) continue;
    INFO(var.name << " allowed '" << var.allowed << "'");
    const mwms::common::EnvRange range = mwms::common::env_range(var.allowed);
    CHECK(range.valid());
    CHECK(range.contains(std::stod(var.default_value)));
    CHECK_NOTHROW(mwms::common::parse_env_number(var, var.default_value));
    ++checked;
  }
  CHECK(checked >= 10);
}

TEST_CASE("env_range reads the registry's forms", "[unit][env]") {
  using mwms::common::env_range;
  CHECK(env_range("> 0").contains(0.001));
  CHECK_FALSE(env_range("> 0").contains(0));
  CHECK(env_range(">= 0").contains(0));
  CHECK_FALSE(env_range(">= 4096").contains(4095));
  CHECK(env_range("1-16").contains(16));
  CHECK_FALSE(env_range("1-16").contains(17));
  CHECK_FALSE(env_range("1-16").contains(0));
  CHECK(env_range("1..65535").contains(65535));
  CHECK_FALSE(env_range("1..65535").contains(65536));
  CHECK(env_range(">= 0; unset: min(30, timeout / 4)").contains(0));
  CHECK_FALSE(env_range(">= 0; unset: min(30, timeout / 4)").contains(-1));
  CHECK_FALSE(env_range("a path").valid());
  CHECK_FALSE(env_range("").valid());
}

TEST_CASE("a numeric variable out of its range or not a number is refused, naming the range",
          "[unit][env]") {
  auto find = [](const char* name) -> const mwms::common::EnvVarInfo& {
    for (const auto& var : env_registry()) {
      if (std::string(var.name) == name) return var;
    }
    FAIL("no " << name);
    return env_registry().front();
  };
  using mwms::common::parse_env_number;
  using Catch::Matchers::Equals;
  const auto& timeout = find("MWMS_TIMEOUT_SECONDS");
  CHECK_THROWS_WITH(parse_env_number(timeout, "0"),
                    Equals("MWMS_TIMEOUT_SECONDS=0 is out of range (allowed: > 0)"));
  CHECK_THROWS_WITH(parse_env_number(timeout, "-5"),
                    Equals("MWMS_TIMEOUT_SECONDS=-5 is out of range (allowed: > 0)"));
  CHECK_THROWS_WITH(parse_env_number(timeout, "abc"),
                    Equals("MWMS_TIMEOUT_SECONDS=abc is not a number (allowed: > 0)"));
  CHECK_THROWS_WITH(parse_env_number(timeout, "inf"),
                    Equals("MWMS_TIMEOUT_SECONDS=inf is not a number (allowed: > 0)"));
  CHECK_THROWS_WITH(parse_env_number(timeout, "12s"),
                    Equals("MWMS_TIMEOUT_SECONDS=12s is not a number (allowed: > 0)"));
  CHECK(parse_env_number(timeout, "0.5") == 0.5);
  const auto& socks = find("MWMS_NSOCKS_PERPEER");
  CHECK_THROWS_WITH(parse_env_number(socks, "17"),
                    Equals("MWMS_NSOCKS_PERPEER=17 is out of range (allowed: 1-16)"));
  CHECK_THROWS_WITH(parse_env_number(socks, "2.5"),
                    Equals("MWMS_NSOCKS_PERPEER=2.5 is not an integer (allowed: 1-16)"));
  CHECK_THROWS_WITH(parse_env_number(socks, "99999999999999999999"),
                    Equals("MWMS_NSOCKS_PERPEER=99999999999999999999 is not an integer (allowed: 1-16)"));
  CHECK(parse_env_number(socks, "16") == 16);
  CHECK_THROWS_AS(parse_env_number(find("MWMS_CHUNK_BYTES"), "1024"), mwms::InvalidArgument);
}
