// The bench tools' command line (bench/common/options.cc): --backend and --compare are checked by
// the bench itself, so a typo is a usage error (status 2) naming the valid values instead of
// CLI11's garbled set and status 105; --backend nccl and --compare nccl go together; bucket_perf's
// flags.
#include "common/options.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <initializer_list>
#include <string>
#include <vector>

#include "common/flag_checks.h"
#include "mwms/errors.h"

namespace {

using mwms::bench::BenchOptions;
using mwms::bench::BucketOptions;

// argv for CLI11 (program name first), kept alive while parsing.
struct Argv {
  explicit Argv(std::initializer_list<const char*> args) : words{"tool"} {
    for (const char* a : args) words.emplace_back(a);
    for (auto& w : words) pointers.push_back(w.data());
  }
  int argc() { return static_cast<int>(pointers.size()); }
  char** argv() { return pointers.data(); }
  std::vector<std::string> words;
  std::vector<char*> pointers;
};

std::optional<BenchOptions> parse(std::initializer_list<const char*> args, int* status) {
  Argv a(args);
  *status = -1;
  return mwms::bench::parse_options(a.argc(), a.argv(), "all_reduce_perf", false, status);
}

std::string invalid_argument(const std::string& text) {
  try {
    mwms::bench::parse_compare(text);
  } catch (const mwms::InvalidArgument& e) {
    return e.message();
  }
  FAIL("parse_compare('" << text << "') did not throw InvalidArgument");
  return {};
}

}  // namespace

TEST_CASE("bench --compare: lists of mpi and gloo and nccl or none", "[unit][bench]") {
  const auto set = mwms::bench::parse_compare("mpi,gloo");
  CHECK(set.mpi);
  CHECK(set.gloo);
  CHECK_FALSE(set.nccl);
  CHECK(mwms::bench::parse_compare("gloo,mpi").mpi);
  CHECK(mwms::bench::parse_compare("nccl").nccl);
  const auto none = mwms::bench::parse_compare("none");
  CHECK_FALSE(none.mpi);
  CHECK_FALSE(none.gloo);
  CHECK_FALSE(none.nccl);
}

TEST_CASE("bench --compare: a typo names the value and every valid one", "[unit][bench]") {
  const std::string message = invalid_argument("mpii");
  CHECK(message.find("'mpii'") != std::string::npos);
  for (const char* valid : {"mpi", "gloo", "nccl", "none"}) {
    CHECK(message.find(valid) != std::string::npos);
  }
  CHECK(invalid_argument("mpi,").find("empty item") != std::string::npos);
  CHECK(invalid_argument("none,mpi").find("none cannot be combined") != std::string::npos);
  CHECK(invalid_argument("mpi,glo").find("'glo'") != std::string::npos);
}

TEST_CASE("bench flags: a bad --compare or --backend exits 2 and not 105", "[unit][bench]") {
  int status = 0;
  CHECK_FALSE(parse({"--compare", "mpii"}, &status));
  CHECK(status == 2);
  CHECK_FALSE(parse({"--backend", "carrier-pigeon"}, &status));
  CHECK(status == 2);
  // Malformed lines: 2 like every other bad flag (bench/README.md), not CLI11's 104-114.
  CHECK_FALSE(parse({"--no-such-flag"}, &status));
  CHECK(status == 2);
  CHECK_FALSE(parse({"-n", "abc"}, &status));
  CHECK(status == 2);
  CHECK_FALSE(parse({"-b"}, &status));
  CHECK(status == 2);
  CHECK_FALSE(parse({"--help"}, &status));
  CHECK(status == 0);
}

TEST_CASE("bench flags: --backend nccl with --compare nccl and not with mpi or gloo",
          "[unit][bench]") {
  int status = 0;
  auto o = parse({"--backend", "nccl", "--compare", "nccl", "-b", "8", "-e", "1G"}, &status);
  REQUIRE(o);
  CHECK(o->backend == "nccl");
  CHECK(o->compare_nccl);
  CHECK_FALSE(o->compare_mpi);
  CHECK(mwms::bench::device_backend(*o));
  CHECK(mwms::bench::transport_choice(*o) == std::nullopt);  // MWMS_TRANSPORT decides
  CHECK(o->max_bytes == std::size_t{1} << 30);
  CHECK_FALSE(parse({"--compare", "nccl"}, &status));  // raw NCCL needs device buffers
  CHECK(status == 2);
  CHECK_FALSE(parse({"--backend", "nccl", "--compare", "mpi"}, &status));
  CHECK(status == 2);
  CHECK_FALSE(parse({"--backend", "nccl", "--compare", "gloo"}, &status));
  CHECK(status == 2);
  o = parse({"--backend", "tcp", "--compare", "mpi,gloo"}, &status);
  REQUIRE(o);
  CHECK(o->compare_mpi);
  CHECK(o->compare_gloo);
  CHECK_FALSE(o->compare_nccl);
  CHECK_FALSE(mwms::bench::device_backend(*o));
  CHECK(mwms::bench::transport_choice(*o) == mwms::TransportChoice::kTcp);
}

TEST_CASE("bucket_perf flags: defaults are issue 6's 200 tensors of 25 MiB", "[unit][bench]") {
  Argv none({});
  int status = -1;
  auto o =
      mwms::bench::parse_bucket_options(none.argc(), none.argv(), "bucket_perf", false, &status);
  REQUIRE(o);
  CHECK(o->tensors == 200);
  CHECK(o->total_bytes == std::size_t{25} << 20);
  CHECK(o->bytes_per_pack == 0);
  CHECK(o->backend.empty());

  Argv some({"-t", "50", "-s", "1M", "--bytes-per-pack", "256K", "--backend", "shm", "-d",
             "bfloat16", "-o", "max", "-n", "3", "-w", "0", "--json", "/tmp/x.json"});
  o = mwms::bench::parse_bucket_options(some.argc(), some.argv(), "bucket_perf", false, &status);
  REQUIRE(o);
  CHECK(o->tensors == 50);
  CHECK(o->total_bytes == std::size_t{1} << 20);
  CHECK(o->bytes_per_pack == std::size_t{256} << 10);
  CHECK(o->backend == "shm");
  CHECK(o->dtype == mwms::DataType::kBFloat16);
  CHECK(o->op == mwms::ReduceOp::kMax);
  CHECK(o->iters == 3);
  CHECK(o->warmup_iters == 0);
  CHECK(o->json_path == "/tmp/x.json");

  for (auto bad :
       {std::vector<const char*>{"--backend", "shmm"}, std::vector<const char*>{"-t", "0"},
        std::vector<const char*>{"-t", "300", "-s", "1K"},  // fewer elements than tensors
        std::vector<const char*>{"-n", "0"}, std::vector<const char*>{"-s", "12Q"},
        std::vector<const char*>{"-n", "abc"}, std::vector<const char*>{"--tensorz", "5"}}) {
    std::vector<std::string> words{"bucket_perf"};
    for (const char* w : bad) words.emplace_back(w);
    std::vector<char*> argv;
    for (auto& w : words) argv.push_back(w.data());
    INFO(words[1] << " " << words[2]);
    status = -1;
    CHECK_FALSE(mwms::bench::parse_bucket_options(static_cast<int>(argv.size()), argv.data(),
                                                  "bucket_perf", false, &status));
    CHECK(status == 2);
  }
}

TEST_CASE("bench flags: 0/1 and bounded flags outside their range exit 2", "[unit][bench]") {
  int status = 0;
  for (auto bad : {std::vector<const char*>{"-c", "2"}, std::vector<const char*>{"-c", "-1"},
                   std::vector<const char*>{"--check", "10"}, std::vector<const char*>{"-n", "0"},
                   std::vector<const char*>{"-w", "-1"}, std::vector<const char*>{"-f", "1"},
                   std::vector<const char*>{"-f", "0.5"}}) {
    Argv a({bad[0], bad[1]});
    INFO(bad[0] << " " << bad[1]);
    status = -1;
    CHECK_FALSE(mwms::bench::parse_options(a.argc(), a.argv(), "all_reduce_perf", false, &status));
    CHECK(status == 2);
  }
  Argv root({"-r", "-1"});
  CHECK_FALSE(mwms::bench::parse_options(root.argc(), root.argv(), "broadcast_perf", false,
                                         &status, mwms::bench::ToolFlags{true, false}));
  CHECK(status == 2);
  for (const char* check : {"0", "1"}) {
    auto o = parse({"-c", check}, &status);
    REQUIRE(o);
    CHECK(o->check == (check[0] - '0'));
  }
  for (auto bad : {std::vector<const char*>{"-c", "2"}, std::vector<const char*>{"-t", "-1"},
                   std::vector<const char*>{"-w", "-1"}}) {
    Argv a({bad[0], bad[1]});
    INFO(bad[0] << " " << bad[1]);
    status = -1;
    CHECK_FALSE(
        mwms::bench::parse_bucket_options(a.argc(), a.argv(), "bucket_perf", false, &status));
    CHECK(status == 2);
  }
}

TEST_CASE("bench flag checks name the flag, the value and the rule", "[unit][bench]") {
  CHECK_THROWS_WITH(mwms::bench::check_flag_0_or_1("-c/--check", 2),
                    "-c/--check 2: must be 0 or 1");
  CHECK_NOTHROW(mwms::bench::check_flag_0_or_1("-c/--check", 0));
  CHECK_NOTHROW(mwms::bench::check_flag_0_or_1("-c/--check", 1));
  CHECK_THROWS_WITH(mwms::bench::check_flag_at_least("-n/--iters", 0, 1),
                    "-n/--iters 0: must be >= 1");
  CHECK_NOTHROW(mwms::bench::check_flag_at_least("-n/--iters", 1, 1));
  CHECK_THROWS_WITH(mwms::bench::check_flag_above("-f/--stepfactor", 1, 1),
                    "-f/--stepfactor 1: must be > 1");
  CHECK_THROWS_AS(mwms::bench::check_flag_above("-f/--stepfactor", std::nan(""), 1),
                  mwms::InvalidArgument);
  CHECK_NOTHROW(mwms::bench::check_flag_above("-f/--stepfactor", 1.5, 1));
}
