// MWMS_TRACE_FILE and MWMS_TRACE_BUFFER (src/collective/trace.h): real ranks write a Chrome
// trace that parses and lists every collective with the right seq, bytes, algorithm and thread;
// the flight recorder keeps the last K in order.
#include <catch2/catch.hpp>

#include <csignal>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "collective/frame.h"
#include "collective/trace.h"
#include "multiproc/launcher.h"
#include "mwms/mwms.h"

TEST_CASE("MWMS_TRACE_FILE writes a Chrome trace of every collective of each rank", "[tcp]") {
  char tmpl[] = "/tmp/mwms-trace-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  const std::string dir = tmpl;
  mwms::testing::LaunchOptions launch;
  launch.world_size = 2;
  launch.timeout_seconds = 60;
  auto results = mwms::testing::run_ranks(launch, [&](int, const std::string& tf, auto) {
    // The child has read no MWMS_* value yet (env values are read once per process).
    ::setenv("MWMS_TRACE_FILE", (dir + "/trace-%r.json").c_str(), 1);
    ::setenv("MWMS_TRACE_BUFFER", "8", 1);
    mwms::CommunicatorOptions copts;
    copts.timeout_seconds = 30;
    auto comm = mwms::Communicator::create(mwms::resolve_tf_config(tf), copts);
    std::vector<float> big(1 << 18, 1.0f), small(10, 2.0f);
    std::vector<std::int32_t> ints(100, comm->rank());
    comm->all_reduce(big.data(), big.size(), mwms::DataType::kFloat32, mwms::ReduceOp::kSum);
    comm->broadcast(ints.data(), ints.size(), mwms::DataType::kInt32, 1);
    comm->barrier();
    comm->all_reduce_async(small.data(), small.size(), mwms::DataType::kFloat32,
                           mwms::ReduceOp::kMax)->wait();
  });
  INFO(mwms::testing::describe(results));
  for (const auto& r : results) REQUIRE(r.exit_code == 0);
  for (int rank = 0; rank < 2; ++rank) {
    const std::string path = dir + "/trace-" + std::to_string(rank) + ".json";
    std::ifstream in(path);
    REQUIRE(in.good());
    std::stringstream text;
    text << in.rdbuf();
    const nlohmann::json trace = nlohmann::json::parse(text.str());  // closed, valid JSON
    std::vector<nlohmann::json> events;
    for (const auto& e : trace) {
      if (e["ph"] == "X") events.push_back(e);
    }
    INFO(path << ": " << text.str());
    REQUIRE(events.size() == 4);
    const char* names[] = {"all_reduce", "broadcast", "barrier", "all_reduce"};
    const std::uint64_t bytes[] = {(1u << 18) * 4, 400, 4, 40};
    for (std::size_t i = 0; i < 4; ++i) {
      CHECK(events[i]["name"] == names[i]);
      CHECK(events[i]["pid"] == rank);
      CHECK(events[i]["args"]["seq"] == i);
      CHECK(events[i]["args"]["bytes"] == bytes[i]);
      CHECK(events[i]["args"]["status"] == "ok");
      CHECK(events[i]["dur"].get<long long>() >= 0);
      CHECK(events[i]["ts"].get<long long>() > 1600000000LL * 1000000);
      CHECK(events[i]["tid"] == (i == 3 ? 1 : 0));  // the async one ran on the progress thread
    }
    CHECK(events[0]["args"]["algorithm"] == "ring");  // 1 MiB, 2 ranks
    CHECK(events[0]["args"]["transport"] == "1 shm");  // one host: shared memory
    CHECK(events[1]["args"]["dtype"] == "int32");
    CHECK(events[3]["args"]["op"] == "max");
    CHECK(trace[0]["args"]["name"].get<std::string>().find("rank " + std::to_string(rank)) == 0);
  }
}

TEST_CASE("the flight recorder keeps the last K collectives, oldest first", "[unit]") {
  mwms::collective::Tracer t(0, "", 3, "");
  REQUIRE(t.enabled());
  for (std::uint64_t s = 0; s < 5; ++s) {
    mwms::collective::TraceEvent e;
    e.seq = s;
    e.bytes = 100 * s;
    e.kind = static_cast<std::uint8_t>(mwms::collective::CollectiveKind::kAllReduce);
    e.failed = s == 4;
    t.record(e);
  }
  const auto recent = t.recent();
  REQUIRE(recent.size() == 3);
  CHECK(recent[0].seq == 2);
  CHECK(recent[2].seq == 4);
  CHECK(t.recent_text().find("seq 4 all_reduce 400 bytes") != std::string::npos);
  CHECK(t.recent_text().find("FAILED") != std::string::npos);
  mwms::collective::Tracer off(0, "", 0, "");
  CHECK_FALSE(off.enabled());
}

TEST_CASE("a rank killed mid-job leaves a complete trace of what it finished", "[tcp]") {
  char tmpl[] = "/tmp/mwms-trace-kill-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  const std::string dir = tmpl;
  mwms::testing::LaunchOptions launch;
  launch.world_size = 2;
  launch.timeout_seconds = 60;
  auto results = mwms::testing::run_ranks(launch, [&](int rank, const std::string& tf, auto) {
    ::setenv("MWMS_TRACE_FILE", (dir + "/t-%r.json").c_str(), 1);
    mwms::CommunicatorOptions copts;
    copts.timeout_seconds = 20;
    auto comm = mwms::Communicator::create(mwms::resolve_tf_config(tf), copts);
    std::vector<float> v(1000, 1.0f);
    for (int i = 0; i < 3; ++i) {
      comm->all_reduce(v.data(), v.size(), mwms::DataType::kFloat32, mwms::ReduceOp::kSum);
    }
    if (rank == 1) ::raise(SIGKILL);  // no destructor, no flush at exit
    try {
      comm->all_reduce(v.data(), v.size(), mwms::DataType::kFloat32, mwms::ReduceOp::kSum);
    } catch (const mwms::PeerError&) {
      // expected: rank 1 is gone
    }
    ::raise(SIGKILL);  // rank 0 dies too, after recording the failed collective
  });
  INFO(mwms::testing::describe(results));
  for (int rank = 0; rank < 2; ++rank) {
    std::ifstream in(dir + "/t-" + std::to_string(rank) + ".json");
    REQUIRE(in.good());
    std::stringstream text;
    text << in.rdbuf();
    INFO("rank " << rank << ": " << text.str());
    nlohmann::json trace;
    REQUIRE_NOTHROW(trace = nlohmann::json::parse(text.str()));
    int ok = 0, failed = 0;
    for (const auto& e : trace) {
      if (e["ph"] != "X") continue;
      (e["args"]["status"] == "ok" ? ok : failed) += 1;
    }
    CHECK(ok == 3);
    CHECK(failed == (rank == 0 ? 1 : 0));
  }
}
