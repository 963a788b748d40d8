// The bench tables (bench/common/output.cc): the --compare gloo table has a time column per Gloo
// algorithm as the MPI one has, --compare nccl adds raw NCCL's time, busbw and ratio with the
// 16 MiB target line in the footer, and bucket_perf's row and JSON carry the speedup.
#include "common/output.h"

#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace {

using mwms::bench::ResultRow;

std::vector<std::string> split_words(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

ResultRow row_of(std::size_t bytes, double time_us, double busbw) {
  ResultRow r;
  r.bytes = bytes;
  r.count = bytes / 4;
  r.type = "float32";
  r.redop = "sum";
  r.time_us = time_us;
  r.algbw = busbw;
  r.busbw = busbw;
  r.wrong = 0;
  return r;
}

}  // namespace

TEST_CASE("bench table: Gloo columns carry each algorithm's time like MPI's", "[unit][bench]") {
  std::ostringstream out;
  mwms::bench::print_table_header(out, true, true);
  ResultRow r = row_of(1024, 10.0, 2.0);
  r.has_mpi = true;
  r.mpi_time_us = 20.0;
  r.mpi_busbw = 1.0;
  r.has_gloo = true;
  r.gloo_ring_time_us = 40.0;
  r.gloo_ring_busbw = 0.5;
  r.gloo_hd_time_us = 25.0;
  r.gloo_hd_busbw = 0.8;
  mwms::bench::print_table_row(out, r);
  const auto lines = lines_of(out.str());
  REQUIRE(lines.size() == 3);
  CHECK(lines[0].find("ring time") != std::string::npos);
  CHECK(lines[0].find("hd time") != std::string::npos);
  CHECK(lines[0].find("ring time") < lines[0].find("ring busbw"));
  // Header names are right-aligned over their values: each name ends where its value ends.
  const std::size_t ring_time_end = lines[0].find("ring time") + std::string("ring time").size();
  CHECK(lines[2].substr(0, ring_time_end).find("40.00") == ring_time_end - 5);
  const std::size_t hd_time_end = lines[0].find("hd time") + std::string("hd time").size();
  CHECK(lines[2].substr(0, hd_time_end).find("25.00") == hd_time_end - 5);
  const auto values = split_words(lines[2]);
  // size count type redop time algbw busbw #wrong | mpi: time busbw ratio | gloo: 5 values
  REQUIRE(values.size() == 16);
  CHECK(values[11] == "40.00");
  CHECK(values[12] == "0.50");
  CHECK(values[13] == "25.00");
  CHECK(values[14] == "0.80");
  CHECK(values[15] == "2.50");  // 2.0 / max(0.5, 0.8)
}

TEST_CASE("bench table: --compare nccl columns and ratio and the 16 MiB footer line",
          "[unit][bench]") {
  std::vector<ResultRow> rows;
  for (std::size_t bytes : {std::size_t{8}, std::size_t{16} << 20, std::size_t{64} << 20}) {
    const bool large = bytes >= (std::size_t{16} << 20);
    ResultRow r = row_of(bytes, 100.0, large ? 98.0 : 1.0);
    r.has_nccl = true;
    r.nccl_time_us = large ? 98.0 : 25.0;  // ours 100 us: 0.98 of raw NCCL, 0.25 when small
    r.nccl_busbw = large ? 100.0 : 4.0;
    rows.push_back(r);
  }
  CHECK(mwms::bench::nccl_ratio(rows[0]) == Approx(0.25));
  CHECK(mwms::bench::nccl_ratio(rows[2]) == Approx(0.98));
  std::ostringstream out;
  mwms::bench::print_table_header(out, false, false, true);
  mwms::bench::print_table_row(out, rows[2]);
  const auto lines = lines_of(out.str());
  REQUIRE(lines.size() == 3);
  CHECK(lines[0].find("nccl time") != std::string::npos);
  CHECK(lines[0].find("vs nccl") != std::string::npos);
  CHECK(lines[0].find("mpi") == std::string::npos);
  const auto values = split_words(lines[2]);
  REQUIRE(values.size() == 11);
  CHECK(values[8] == "98.00");
  CHECK(values[9] == "100.00");
  CHECK(values[10] == "0.98");

  const auto summary = mwms::bench::summarize(rows);
  CHECK(summary.has_nccl);
  CHECK(summary.median_nccl_ratio == Approx(0.98));        // of 0.25, 0.98, 0.98
  CHECK(summary.median_nccl_ratio_large == Approx(0.98));  // the two rows from 16 MiB
  std::ostringstream footer;
  mwms::bench::print_table_footer(footer, summary);
  CHECK(
      footer.str().find("# Median vs NCCL 16M+  : 0.98 (rows of 16 MiB or more; target >= 0.97)") !=
      std::string::npos);

  rows.resize(1);  // only small rows: no target line value
  std::ostringstream small;
  mwms::bench::print_table_footer(small, mwms::bench::summarize(rows));
  CHECK(small.str().find("n/a (no row of 16 MiB or more)") != std::string::npos);
}

TEST_CASE("bench JSON: nccl keys in rows and summary", "[unit][bench]") {
  ResultRow r = row_of(std::size_t{32} << 20, 100.0, 90.0);
  r.has_nccl = true;
  r.nccl_time_us = 90.0;  // one rank: busbw 0 on both sides, the ratio still 0.9
  r.nccl_busbw = 100.0;
  mwms::bench::RunInfo info;
  info.collective = "all_reduce";
  info.ranks = 1;
  info.backend = "nccl";
  info.nccl_library = "NCCL 2.28.9";
  info.environment = {{"NCCL_ALGO", "Ring"}, {"NCCL_PROTO", "Simple"}};
  const std::vector<ResultRow> rows{r};
  const std::string path = "bench_output_test_nccl.json";
  mwms::bench::write_json(path, rows, info, mwms::bench::summarize(rows));
  std::ifstream in(path);
  const auto j = nlohmann::json::parse(in);
  std::remove(path.c_str());
  REQUIRE(j.size() == 2);
  CHECK(j[0]["nccl_busbw"] == 100.0);
  CHECK(j[0]["nccl_time_us"] == 90.0);
  CHECK(j[0]["nccl_ratio"].get<double>() == Approx(0.9));
  CHECK(j[1]["nccl_library"] == "NCCL 2.28.9");
  CHECK(j[1]["median_nccl_ratio_16m"].get<double>() == Approx(0.9));
  // The variables that forced what was measured, as an object in the summary.
  CHECK(j[1]["environment"].dump() == R"({"NCCL_ALGO":"Ring","NCCL_PROTO":"Simple"})");
  CHECK(j[1]["complete"] == true);
  CHECK(j[1]["ok"] == true);
}

TEST_CASE("bucket_perf: row and speedup footer and JSON", "[unit][bench]") {
  mwms::bench::BucketRow row;
  row.tensors = 200;
  row.bytes = 26214400;
  row.smallest_bytes = 256;
  row.largest_bytes = 1044672;
  row.type = "float32";
  row.redop = "sum";
  row.buckets = 8;
  row.bucketed_time_us = 1000.0;
  row.bucketed_busbw = 26.2;
  row.separate_time_us = 6000.0;
  row.separate_busbw = 4.37;
  row.wrong = 0;
  CHECK(mwms::bench::bucket_speedup(row) == Approx(6.0));
  std::ostringstream out;
  mwms::bench::print_bucket_table(out, row);
  const auto lines = lines_of(out.str());
  REQUIRE(lines.size() >= 5);
  CHECK(lines[0].find("bucket time") != std::string::npos);
  CHECK(lines[0].find("speedup") != std::string::npos);
  const auto values = split_words(lines[2]);
  REQUIRE(values.size() == 13);
  CHECK(values[0] == "200");
  CHECK(values[6] == "8");
  CHECK(values[7] == "1000.00");
  CHECK(values[9] == "6000.00");
  CHECK(values[11] == "6.00");
  CHECK(values[12] == "0");
  CHECK(out.str().find("# Out of bounds values : 0 OK") != std::string::npos);
  CHECK(out.str().find("# Bucket speedup       : 6 (separate / bucketed") != std::string::npos);

  mwms::bench::BucketRunInfo info;
  info.buffers = "host";
  info.ranks = 2;
  info.backend = "shm";
  info.bytes_per_pack = 4194304;
  const std::string path = "bench_output_test_bucket.json";
  mwms::bench::write_bucket_json(path, row, info);
  std::ifstream in(path);
  const auto j = nlohmann::json::parse(in);
  std::remove(path.c_str());
  REQUIRE(j.size() == 1);
  CHECK(j[0]["tool"] == "bucket_perf");
  CHECK(j[0]["speedup"].get<double>() == Approx(6.0));
  CHECK(j[0]["buckets"] == 8);
  CHECK(j[0]["bytes_per_pack"] == 4194304);
  CHECK(j[0]["wrong"] == 0);
  row.wrong = -1;
  mwms::bench::write_bucket_json(path, row, info);
  std::ifstream again(path);
  CHECK(nlohmann::json::parse(again)[0]["wrong"].is_null());
  std::remove(path.c_str());
}
