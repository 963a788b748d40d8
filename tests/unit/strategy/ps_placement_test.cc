// place_variables and Partitioner against TensorFlow 2.21 itself: every vector of
// tests/data/ps/tf_placement_vectors.json (written by scripts/tf_ps_vectors.py from
// get_variable, the tf.compat.v1 partitioners and replica_device_setter; no TensorFlow is needed
// here) must give TF's names, slices and ps tasks, or raise where TF raises, or be one of the
// deliberate stricter checks listed below (Note [TF placement semantics] in
// src/strategy/ps/placement.cc). Then hand-written corners and errors.
#include "mwms/ps_placement.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "mwms/errors.h"
#include "mwms/types.h"

namespace {

using mwms::DataType;
using mwms::InvalidArgument;
using mwms::Partitioner;
using mwms::PsPlacement;
using mwms::VariableShard;
using mwms::VariableSpec;
using nlohmann::json;
using Shape = std::vector<std::int64_t>;

struct Deliberate {
  const char* partitioner;  // vectors with this partitioner label
  const char* reason;       // why libmwms rejects the partitioner TensorFlow builds
};

// Each entry must match at least one vector (checked below), so the table cannot go stale.
const Deliberate kDeliberate[] = {
    {"fixed_size(0)", "TF raises \"zero partitions\" only once a non-scalar variable uses it"},
    {"fixed_size(-1)", "TF raises \"zero partitions\" only once a non-scalar variable uses it"},
    {"min_max(0,1)", "TF silently makes max_partitions 0 mean 1"},
    {"min_max(-2,1)", "TF silently makes a negative max_partitions mean 1"},
    {"min_max(4,0)", "TF raises ZeroDivisionError, and only for a non-scalar variable"},
    {"min_max(4,-5)", "TF silently makes every variable one slice"},
};

json load_vectors() {
  const std::string path =
      std::string(MWMS_SOURCE_DIR) + "/tests/data/ps/tf_placement_vectors.json";
  std::ifstream in(path);
  INFO("reading " << path);
  REQUIRE(in.good());
  std::stringstream text;
  text << in.rdbuf();
  return json::parse(text.str());
}

// The generator's label for a partitioner ("none", "fixed_size(3)", "min_max(4,1024)").
std::string label_of(const json& p) {
  const std::string kind = p.at("kind");
  if (kind == "fixed_size")
    return "fixed_size(" + std::to_string(p.at("num_shards").get<int>()) + ")";
  if (kind == "min_max") {
    return "min_max(" + std::to_string(p.at("max_partitions").get<int>()) + "," +
           std::to_string(p.at("min_slice_size").get<std::int64_t>()) + ")";
  }
  return kind;
}

Partitioner partitioner_of(const json& p) {
  const std::string kind = p.at("kind");
  if (kind == "fixed_size") return Partitioner::fixed_size(p.at("num_shards").get<int>());
  if (kind == "min_max") {
    return Partitioner::min_max(p.at("max_partitions").get<int>(),
                                p.at("min_slice_size").get<std::int64_t>());
  }
  REQUIRE(kind == "none");
  return Partitioner();
}

std::int64_t product(const Shape& shape, std::size_t from) {
  std::int64_t n = 1;
  for (std::size_t i = from; i < shape.size(); ++i) n *= shape[i];
  return n;
}

// TF's var_offset and var_shape of `s`: the slice starts at row_offset of axis 0.
Shape offset_of(const VariableShard& s, const VariableSpec& v) {
  Shape out(v.shape.size(), 0);
  if (!out.empty()) out[0] = s.row_offset;
  return out;
}

Shape shape_of(const VariableShard& s, const VariableSpec& v) {
  Shape out = v.shape;
  if (!out.empty()) out[0] = s.rows;
  return out;
}

std::vector<VariableSpec> specs(std::initializer_list<VariableSpec> list) { return list; }

std::vector<int> tasks_of(const std::vector<VariableShard>& shards) {
  std::vector<int> out;
  for (const VariableShard& s : shards) out.push_back(s.ps_task);
  return out;
}

}  // namespace

TEST_CASE("place_variables puts every variable op where TensorFlow 2.21 does",
          "[unit][ps][tf_semantics]") {
  const json doc = load_vectors();
  std::map<std::string, std::vector<VariableSpec>> lists;
  for (const auto& [key, vars] : doc.at("variable_lists").items()) {
    for (const json& v : vars) {
      lists[key].push_back({v.at(0).get<std::string>(), v.at(1).get<Shape>(),
                            mwms::parse_dtype(v.at(2).get<std::string>())});
    }
  }
  const json& vectors = doc.at("placements");
  REQUIRE(vectors.size() >= 300);
  std::size_t compared = 0;
  for (const json& v : vectors) {
    INFO("vector " << v.at("label").get<std::string>());
    const std::vector<VariableSpec>& vars = lists.at(v.at("variables").get<std::string>());
    const int num_ps = v.at("num_ps");
    const Partitioner partitioner = partitioner_of(v.at("partitioner"));
    CHECK(partitioner.describe().size() > 0);
    const PsPlacement placement = mwms::parse_ps_placement(v.at("strategy").get<std::string>());
    const std::vector<VariableShard> got =
        mwms::place_variables(vars, num_ps, placement, partitioner);
    const json& want = v.at("shards");
    REQUIRE(got.size() == want.size());
    std::vector<std::size_t> tf_bytes(static_cast<std::size_t>(num_ps), 0);
    for (std::size_t k = 0; k < got.size(); ++k) {
      const VariableShard& s = got[k];
      const json& w = want[k];
      INFO("shard " << k << " (TF " << w.dump() << ")");
      REQUIRE(s.variable == w.at(0).get<int>());
      const VariableSpec& spec = vars[static_cast<std::size_t>(s.variable)];
      CHECK(s.name == w.at(1).get<std::string>());
      CHECK(s.ps_task == w.at(2).get<int>());
      const Shape tf_offset = w.at(3).get<Shape>();
      const Shape tf_shape = w.at(4).get<Shape>();
      CHECK(offset_of(s, spec) == tf_offset);
      CHECK(shape_of(s, spec) == tf_shape);
      CHECK(s.count == static_cast<std::size_t>(product(tf_shape, 0)));
      const std::int64_t tf_row = tf_offset.empty() ? 0 : tf_offset[0];
      CHECK(s.element_offset == static_cast<std::size_t>(tf_row * product(spec.shape, 1)));
      CHECK(s.partitioned == partitioner.is_partitioned(spec.shape));
      CHECK(s.num_shards == partitioner.num_partitions(spec.shape, spec.dtype));
      CHECK(s.shard == (k == 0 || got[k - 1].variable != s.variable ? 0 : got[k - 1].shard + 1));
      tf_bytes[static_cast<std::size_t>(w.at(2).get<int>())] +=
          static_cast<std::size_t>(product(tf_shape, 0)) * mwms::dtype_size(spec.dtype);
      ++compared;
    }
    CHECK(mwms::bytes_per_ps(got, vars, num_ps) == tf_bytes);
  }
  CHECK(compared >= 4000);
}

TEST_CASE("Partitioner slices or refuses each shape as TensorFlow 2.21 does",
          "[unit][ps][tf_semantics]") {
  const json doc = load_vectors();
  const json& vectors = doc.at("partitions");
  REQUIRE(vectors.size() >= 400);
  std::map<std::string, int> used;
  int agreed = 0;
  int raised_both = 0;
  for (const json& v : vectors) {
    INFO("vector " << v.at("label").get<std::string>());
    const std::string plabel = label_of(v.at("partitioner"));
    const Deliberate* deliberate = nullptr;
    for (const Deliberate& d : kDeliberate) {
      if (plabel == d.partitioner) deliberate = &d;
    }
    if (deliberate != nullptr) {
      INFO("deliberate: " << deliberate->reason);
      CHECK_THROWS_AS(partitioner_of(v.at("partitioner")), InvalidArgument);
      ++used[deliberate->partitioner];
      continue;
    }
    const Partitioner partitioner = partitioner_of(v.at("partitioner"));
    const Shape shape = v.at("shape").get<Shape>();
    const DataType dtype = mwms::parse_dtype(v.at("dtype").get<std::string>());
    const std::vector<VariableSpec> vars = {{"v", shape, dtype}};
    if (v.at("tf_raised").get<bool>()) {
      INFO("TensorFlow raised " << v.at("error_kind").get<std::string>() << ": "
                                << v.at("error").get<std::string>());
      CHECK_THROWS_AS(partitioner.num_partitions(shape, dtype), InvalidArgument);
      CHECK_THROWS_AS(mwms::place_variables(vars, 2, PsPlacement::kRoundRobin, partitioner),
                      InvalidArgument);
      ++raised_both;
      continue;
    }
    CHECK(partitioner.is_partitioned(shape) == v.at("partitioned").get<bool>());
    CHECK(partitioner.num_partitions(shape, dtype) == v.at("num_partitions").get<int>());
    const auto shards = mwms::place_variables(vars, 2, PsPlacement::kRoundRobin, partitioner);
    REQUIRE(static_cast<int>(shards.size()) == v.at("num_partitions").get<int>());
    const json& rows = v.at("rows_first_last");
    if (rows.at(0).is_null()) {
      CHECK(shape.empty());
      CHECK(shards.front().rows == 1);  // a scalar counts as one row
    } else {
      CHECK(shards.front().rows == rows.at(0).get<std::int64_t>());
      CHECK(shards.back().rows == rows.at(1).get<std::int64_t>());
    }
    ++agreed;
  }
  for (const Deliberate& d : kDeliberate) {
    INFO("deliberate difference " << d.partitioner << " matches no vector any more");
    CHECK(used[d.partitioner] > 0);
  }
  CHECK(agreed > 100);
  CHECK(raised_both > 100);
}

TEST_CASE("Partitioner describes itself and rejects bad parameters", "[unit][ps]") {
  CHECK(Partitioner().describe() == "none");
  CHECK(Partitioner::fixed_size(4).describe() == "fixed_size(4)");
  CHECK(Partitioner::min_max(8, 262144).describe() == "min_max(8, 262144)");
  CHECK(Partitioner::min_max().describe() == "min_max(1, 262144)");
  CHECK(Partitioner::fixed_size(4).num_shards() == 4);
  CHECK(Partitioner::fixed_size(4).max_partitions() == 0);
  CHECK(Partitioner::min_max(8, 1024).max_partitions() == 8);
  CHECK(Partitioner::min_max(8, 1024).min_slice_size() == 1024);
  CHECK(Partitioner().kind() == Partitioner::Kind::kNone);
  CHECK(Partitioner::fixed_size(2) == Partitioner::fixed_size(2));
  CHECK(Partitioner::fixed_size(2) != Partitioner::min_max(2, 1));
  CHECK_THROWS_AS(Partitioner::fixed_size(0), InvalidArgument);
  CHECK_THROWS_AS(Partitioner::fixed_size(-3), InvalidArgument);
  CHECK_THROWS_AS(Partitioner::min_max(0), InvalidArgument);
  CHECK_THROWS_AS(Partitioner::min_max(4, 0), InvalidArgument);
  CHECK_THROWS_AS(Partitioner::min_max(4, -1), InvalidArgument);
}

TEST_CASE("Partitioner clamps to the rows and skips scalars", "[unit][ps]") {
  const Partitioner five = Partitioner::fixed_size(5);
  CHECK(five.num_partitions({2, 9}, DataType::kFloat32) == 2);  // more shards than rows
  CHECK(five.num_partitions({1}, DataType::kFloat32) == 1);
  CHECK(five.num_partitions({}, DataType::kFloat32) == 1);
  CHECK_FALSE(five.is_partitioned({}));
  CHECK(five.is_partitioned({1}));
  CHECK_FALSE(Partitioner().is_partitioned({4, 4}));
  // min_max: ceil(bytes / min_slice_size), then max_partitions, then the rows.
  CHECK(Partitioner::min_max(100, 1).num_partitions({3}, DataType::kFloat64) == 3);
  CHECK(Partitioner::min_max(8, 262144).num_partitions({1024, 256}, DataType::kFloat32) == 4);
  CHECK(Partitioner::min_max(8, 262144).num_partitions({1025, 256}, DataType::kFloat32) == 5);
  CHECK(Partitioner::min_max(8, 262144).num_partitions({1025, 256}, DataType::kFloat16) == 3);
  CHECK(Partitioner::min_max(5000).num_partitions({1 << 20, 128}, DataType::kFloat32) == 2048);
  CHECK(Partitioner::min_max(3).num_partitions({1 << 20, 128}, DataType::kFloat32) == 3);
  // An unpartitioned variable may have zero dimensions; a partitioned one may not (as in TF).
  CHECK(Partitioner().num_partitions({0, 4}, DataType::kFloat32) == 1);
  CHECK_THROWS_AS(five.num_partitions({0, 4}, DataType::kFloat32), InvalidArgument);
  CHECK_THROWS_AS(five.num_partitions({4, 0}, DataType::kFloat32), InvalidArgument);
  CHECK_THROWS_AS(Partitioner::min_max(4, 1).num_partitions({0}, DataType::kFloat32),
                  InvalidArgument);
  CHECK_THROWS_AS(Partitioner().num_partitions({-1, 3}, DataType::kFloat32), InvalidArgument);
  CHECK_THROWS_AS(five.num_partitions({3, -2}, DataType::kFloat32), InvalidArgument);
  const std::int64_t big = std::numeric_limits<std::int64_t>::max() / 2;
  CHECK_THROWS_AS(Partitioner().num_partitions({big, 3}, DataType::kFloat32), InvalidArgument);
  CHECK_THROWS_AS(Partitioner::min_max(4, 1).num_partitions({big, 1}, DataType::kFloat64),
                  InvalidArgument);
}

TEST_CASE("place_variables slices as _iter_slices does", "[unit][ps]") {
  const auto shards = mwms::place_variables(specs({{"emb", {10, 3}, DataType::kFloat32}}), 3,
                                            PsPlacement::kRoundRobin, Partitioner::fixed_size(4));
  REQUIRE(shards.size() == 4);
  const std::int64_t rows[] = {3, 3, 2, 2};
  const std::int64_t firsts[] = {0, 3, 6, 8};
  for (int k = 0; k < 4; ++k) {
    const VariableShard& s = shards[static_cast<std::size_t>(k)];
    CHECK(s.name == "emb/part_" + std::to_string(k));
    CHECK(s.shard == k);
    CHECK(s.num_shards == 4);
    CHECK(s.partitioned);
    CHECK(s.rows == rows[k]);
    CHECK(s.row_offset == firsts[k]);
    CHECK(s.element_offset == static_cast<std::size_t>(firsts[k] * 3));
    CHECK(s.count == static_cast<std::size_t>(rows[k] * 3));
  }
  CHECK(tasks_of(shards) == std::vector<int>{0, 1, 2, 0});

  SECTION("one slice of a partitioned variable is still part_0") {
    const auto one = mwms::place_variables(specs({{"b", {3}, DataType::kFloat32}}), 2,
                                           PsPlacement::kRoundRobin, Partitioner::min_max());
    REQUIRE(one.size() == 1);
    CHECK(one[0].name == "b/part_0");
    CHECK(one[0].partitioned);
    CHECK(one[0].num_shards == 1);
  }
  SECTION("a scalar keeps its name under a partitioner and counts as one row") {
    const auto s = mwms::place_variables(specs({{"step", {}, DataType::kInt64}}), 2,
                                         PsPlacement::kRoundRobin, Partitioner::fixed_size(3));
    REQUIRE(s.size() == 1);
    CHECK(s[0].name == "step");
    CHECK_FALSE(s[0].partitioned);
    CHECK(s[0].rows == 1);
    CHECK(s[0].count == 1);
  }
}

TEST_CASE("round-robin advances per slice across variables", "[unit][ps]") {
  const auto vars = specs({{"a", {5, 2}, DataType::kFloat32},
                           {"s", {}, DataType::kFloat32},
                           {"b", {3}, DataType::kFloat32},
                           {"c", {2, 9}, DataType::kFloat32}});
  const auto shards =
      mwms::place_variables(vars, 3, PsPlacement::kRoundRobin, Partitioner::fixed_size(5));
  std::vector<std::string> names;
  for (const auto& s : shards) names.push_back(s.name);
  // a: 5 rows -> 5 parts; s: scalar, whole; b: 3 parts; c: 2 parts (clamped to its rows).
  CHECK(names == std::vector<std::string>{"a/part_0", "a/part_1", "a/part_2", "a/part_3",
                                          "a/part_4", "s", "b/part_0", "b/part_1", "b/part_2",
                                          "c/part_0", "c/part_1"});
  CHECK(tasks_of(shards) == std::vector<int>{0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1});
  const auto one = mwms::place_variables(vars, 1, PsPlacement::kRoundRobin);
  CHECK(tasks_of(one) == std::vector<int>{0, 0, 0, 0});
}

TEST_CASE("greedy puts each slice on the ps with the fewest bytes", "[unit][ps]") {
  const auto vars = specs({{"w", {100}, DataType::kFloat32},
                           {"x", {10}, DataType::kFloat32},
                           {"y", {10}, DataType::kFloat64},
                           {"z", {50}, DataType::kFloat32},
                           {"t", {25}, DataType::kInt64}});
  const auto shards = mwms::place_variables(vars, 2, PsPlacement::kGreedyByBytes);
  // loads: w 400 -> ps0 (tie: lowest); x 40 -> ps1; y 80 -> ps1 (40 < 400); z 200 -> ps1
  // (120 < 400); t 200 -> ps1 (320 < 400).
  CHECK(tasks_of(shards) == std::vector<int>{0, 1, 1, 1, 1});
  CHECK(mwms::bytes_per_ps(shards, vars, 2) == std::vector<std::size_t>{400, 520});
  // Equal loads go to the lowest index: three equal variables on three ps, then back to 0.
  const auto equal = mwms::place_variables(specs({{"a", {4}}, {"b", {4}}, {"c", {4}}, {"d", {4}}}),
                                           3, PsPlacement::kGreedyByBytes);
  CHECK(tasks_of(equal) == std::vector<int>{0, 1, 2, 0});
  // Slices are loaded one by one: a [7, 1] float32 in 3 parts (3, 2, 2 rows) on 2 ps.
  const auto parts = mwms::place_variables(specs({{"e", {7, 1}}, {"f", {1}}}), 2,
                                           PsPlacement::kGreedyByBytes, Partitioner::fixed_size(3));
  CHECK(tasks_of(parts) == std::vector<int>{0, 1, 1, 0});
  CHECK(mwms::bytes_per_ps(parts, specs({{"e", {7, 1}}, {"f", {1}}}), 2) ==
        std::vector<std::size_t>{16, 16});
}

TEST_CASE("place_variables and bytes_per_ps reject caller bugs", "[unit][ps]") {
  const auto ok = specs({{"a", {4}}});
  CHECK_THROWS_AS(mwms::place_variables(ok, 0), InvalidArgument);
  CHECK_THROWS_AS(mwms::place_variables(ok, -1), InvalidArgument);
  CHECK_THROWS_AS(mwms::place_variables(specs({{"", {4}}}), 1), InvalidArgument);
  CHECK_THROWS_AS(mwms::place_variables(specs({{"a", {4}}, {"a", {2}}}), 2), InvalidArgument);
  CHECK_THROWS_AS(mwms::place_variables(specs({{"a", {-4}}}), 2), InvalidArgument);
  // A slice named like another variable, in either order.
  const auto clash = specs({{"a", {4}}, {"a/part_0", {2}}});
  CHECK_NOTHROW(mwms::place_variables(clash, 2));
  CHECK_THROWS_AS(
      mwms::place_variables(clash, 2, PsPlacement::kRoundRobin, Partitioner::fixed_size(2)),
      InvalidArgument);
  CHECK_THROWS_AS(mwms::place_variables(specs({{"a/part_1", {2}}, {"a", {4}}}), 2,
                                        PsPlacement::kGreedyByBytes, Partitioner::fixed_size(2)),
                  InvalidArgument);
  CHECK(mwms::place_variables({}, 3).empty());
  CHECK(mwms::bytes_per_ps({}, {}, 3) == std::vector<std::size_t>{0, 0, 0});

  auto shards = mwms::place_variables(ok, 2);
  CHECK_THROWS_AS(mwms::bytes_per_ps(shards, ok, 0), InvalidArgument);
  CHECK_THROWS_AS(mwms::bytes_per_ps(shards, {}, 2), InvalidArgument);
  shards[0].ps_task = 2;
  CHECK_THROWS_AS(mwms::bytes_per_ps(shards, ok, 2), InvalidArgument);
  shards[0].ps_task = 0;
  shards[0].variable = -1;
  CHECK_THROWS_AS(mwms::bytes_per_ps(shards, ok, 2), InvalidArgument);
}

TEST_CASE("ps placement names round-trip", "[unit][ps]") {
  CHECK(mwms::to_string(PsPlacement::kRoundRobin) == "round_robin");
  CHECK(mwms::to_string(PsPlacement::kGreedyByBytes) == "greedy");
  CHECK(mwms::parse_ps_placement("round_robin") == PsPlacement::kRoundRobin);
  CHECK(mwms::parse_ps_placement("greedy") == PsPlacement::kGreedyByBytes);
  CHECK_THROWS_AS(mwms::parse_ps_placement("Greedy"), InvalidArgument);
  CHECK_THROWS_AS(mwms::parse_ps_placement(""), InvalidArgument);
  CHECK_THROWS_AS(mwms::parse_ps_placement("round-robin"), InvalidArgument);
}
