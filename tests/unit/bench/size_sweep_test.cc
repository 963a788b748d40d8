// The size sweep both bench drivers share (bench/common/size_sweep.cc): which counts get a row,
// the exit status from the rows' wrong counts, the JSON the leader alone writes, and a row's start.
#include "common/size_sweep.h"

#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "mwms/errors.h"

namespace {

using mwms::bench::BenchOptions;
using mwms::bench::CollectiveDescriptor;
using mwms::bench::ResultRow;
using mwms::bench::RunInfo;

// all_reduce's count: the whole buffer on every rank.
std::size_t count_of(std::size_t bytes, std::size_t elem_bytes, int /*world_size*/) {
  return bytes / elem_bytes;
}

CollectiveDescriptor descriptor() {
  CollectiveDescriptor d{};
  d.name = "all_reduce";
  d.count_for_bytes = count_of;
  return d;
}

BenchOptions options(std::size_t min_bytes, std::size_t max_bytes) {
  BenchOptions o;
  o.min_bytes = min_bytes;
  o.max_bytes = max_bytes;
  o.step_factor = 2;
  o.dtype = mwms::DataType::kFloat32;
  return o;
}

ResultRow row_for(std::size_t count, std::int64_t wrong) {
  ResultRow r;
  r.count = count;
  r.bytes = count * 4;
  r.type = "float32";
  r.redop = "sum";
  r.time_us = 1;
  r.wrong = wrong;
  return r;
}

}  // namespace

TEST_CASE("bench sweep: one row per distinct count, status from the wrong counts",
          "[unit][bench]") {
  const CollectiveDescriptor d = descriptor();
  std::vector<std::size_t> counts;
  int infos = 0;
  auto info = [&] {
    ++infos;
    return RunInfo{};
  };
  // 1 and 2 bytes are both count 0 (one row); then 4 .. 64 bytes: counts 1, 2, 4, 8, 16.
  const int ok = mwms::bench::sweep_sizes(
      d, options(1, 64), 2, /*leader=*/false,
      [&](std::size_t count) {
        counts.push_back(count);
        return row_for(count, count == 0 ? -1 : 0);
      },
      info);
  CHECK(ok == 0);
  CHECK(counts == std::vector<std::size_t>{0, 1, 2, 4, 8, 16});
  CHECK(infos == 0);

  const int wrong = mwms::bench::sweep_sizes(
      d, options(4, 16), 2, /*leader=*/false,
      [&](std::size_t count) { return row_for(count, count == 2 ? 3 : 0); }, info);
  CHECK(wrong == 1);
}

TEST_CASE("bench sweep: the leader writes every row and run_info to the JSON", "[unit][bench]") {
  const CollectiveDescriptor d = descriptor();
  BenchOptions o = options(8, 32);
  o.json_path = "size_sweep_test.json";
  int infos = 0;
  const int status = mwms::bench::sweep_sizes(
      d, o, 2, /*leader=*/true, [](std::size_t count) { return row_for(count, 0); },
      [&] {
        ++infos;
        RunInfo info;
        info.collective = "all_reduce";
        info.ranks = 2;
        return info;
      });
  CHECK(status == 0);
  CHECK(infos == 1);
  std::ifstream in(o.json_path);
  REQUIRE(in);
  const nlohmann::json records = nlohmann::json::parse(in);
  std::remove(o.json_path.c_str());
  REQUIRE(records.size() == 4);  // 8, 16, 32 bytes, then the summary
  CHECK(records[0]["size"] == 8);
  CHECK(records[2]["size"] == 32);
  CHECK(records[3]["record"] == "summary");
  CHECK(records[3]["ranks"] == 2);
}

TEST_CASE("bench sweep: a row starts with the buffer's count, bytes, type and redop",
          "[unit][bench]") {
  CollectiveDescriptor d = descriptor();
  d.uses_op = true;
  BenchOptions o = options(8, 8);
  o.dtype = mwms::DataType::kFloat64;
  o.op = mwms::ReduceOp::kMax;
  const ResultRow row = mwms::bench::start_row(d, o, 5);
  CHECK(row.count == 5);
  CHECK(row.bytes == 40);
  CHECK(row.type == "float64");
  CHECK(row.redop == "max");
  CHECK(row.wrong == -1);
  d.uses_op = false;  // all-gather, broadcast
  CHECK(mwms::bench::start_row(d, o, 5).redop == "none");
}

TEST_CASE("bench sweep: a size that fails keeps the rows before it in the JSON", "[unit][bench]") {
  CollectiveDescriptor d = descriptor();
  d.uses_op = true;
  BenchOptions o = options(8, 64);
  o.json_path = "size_sweep_partial_test.json";
  std::remove(o.json_path.c_str());
  std::vector<std::size_t> counts;
  const auto measure = [&](std::size_t count) {
    counts.push_back(count);
    if (count == 8) throw mwms::PeerError("rank 1 closed its connection");
    return row_for(count, 0);
  };
  const auto info = [] {
    RunInfo i;
    i.collective = "all_reduce";
    i.ranks = 2;
    i.backend = "tcp";
    return i;
  };
  // Not the leader: the error goes on and nothing is written.
  CHECK_THROWS_AS(mwms::bench::sweep_sizes(d, o, 2, /*leader=*/false, measure, info),
                  mwms::PeerError);
  CHECK_FALSE(std::ifstream(o.json_path));
  // The leader: the same error goes on, after the JSON of rows 8 and 16 B and the failed 32 B.
  counts.clear();
  CHECK_THROWS_WITH(mwms::bench::sweep_sizes(d, o, 2, /*leader=*/true, measure, info),
                    Catch::Contains("rank 1 closed its connection"));
  CHECK(counts == std::vector<std::size_t>{2, 4, 8});  // nothing measured after the failure
  std::ifstream in(o.json_path);
  REQUIRE(in);
  const nlohmann::json records = nlohmann::json::parse(in);
  std::remove(o.json_path.c_str());
  REQUIRE(records.size() == 4);
  CHECK(records[0]["record"] == "row");
  CHECK(records[0]["size"] == 8);
  CHECK(records[1]["size"] == 16);
  const nlohmann::json& failure = records[2];
  CHECK(failure["record"] == "failure");
  CHECK(failure["size"] == 32);
  CHECK(failure["count"] == 8);
  CHECK(failure["type"] == "float32");
  CHECK(failure["redop"] == "sum");
  CHECK(failure["backend"] == "tcp");
  CHECK_THAT(failure["error"].get<std::string>(), Catch::Contains("rank 1 closed its connection"));
  const nlohmann::json& summary = records[3];
  CHECK(summary["record"] == "summary");
  CHECK(summary["rows"] == 2);
  CHECK(summary["complete"] == false);
  CHECK(summary["ok"] == false);
}

TEST_CASE("bench sweep: an unwritable JSON after a failed size does not hide the failure",
          "[unit][bench]") {
  const CollectiveDescriptor d = descriptor();
  BenchOptions o = options(8, 16);
  o.json_path = "/nonexistent-dir/size_sweep_test.json";
  CHECK_THROWS_AS(mwms::bench::sweep_sizes(
                      d, o, 2, /*leader=*/true,
                      [](std::size_t) -> ResultRow { throw mwms::TimeoutError("rank 1 is silent"); },
                      [] { return RunInfo{}; }),
                  mwms::TimeoutError);
}
