// The seam's front end over real processes: asynchronous collectives and their Work handles
// (values, call order, errors rethrown from wait(), wait deadlines), and ranks that disagree on
// the transport failing at start-up with both ranks named instead of hanging.
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "multiproc/launcher.h"
#include "mwms/mwms.h"

namespace {

using Catch::Matchers::Contains;
using mwms::testing::LaunchOptions;
using mwms::testing::run_ranks;

mwms::CommunicatorOptions quick(mwms::TransportChoice t, double timeout_seconds = 10) {
  mwms::CommunicatorOptions o;
  o.connect_timeout_seconds = 10;
  o.timeout_seconds = timeout_seconds;
  o.transport = t;
  return o;
}

}  // namespace

TEST_CASE("asynchronous collectives complete in call order with the right values",
          "[tcp][shm][multiproc]") {
  for (mwms::TransportChoice t : {mwms::TransportChoice::kTcp, mwms::TransportChoice::kShm}) {
    LaunchOptions opts;
    opts.world_size = 3;
    opts.timeout_seconds = 60;
    auto results = run_ranks(opts, [t](int rank, const std::string& tf_config, auto) {
      auto comm = mwms::Communicator::create(mwms::resolve_tf_config(tf_config), quick(t));
      const int n = comm->world_size();
      // Eight buckets of different sizes in flight at once, then a blocking call behind them.
      std::vector<std::vector<float>> buckets;
      std::vector<std::shared_ptr<mwms::Work>> works;
      for (int b = 0; b < 8; ++b) {
        buckets.emplace_back(static_cast<std::size_t>(1 + b * 40000), static_cast<float>(rank + b));
      }
      for (auto& v : buckets) {
        works.push_back(comm->all_reduce_async(v.data(), v.size(), mwms::DataType::kFloat32,
                                               mwms::ReduceOp::kSum));
      }
      std::vector<double> root_value(5, rank == 1 ? 42.0 : 0.0);
      comm->broadcast(root_value.data(), root_value.size(), mwms::DataType::kFloat64, 1);
      for (auto& w : works) w->wait();
      for (auto& w : works) {
        if (!w->test()) throw std::runtime_error("test() false after wait()");
      }
      for (std::size_t b = 0; b < buckets.size(); ++b) {
        // sum over ranks of (rank + b) = n(n-1)/2 + n*b
        float want = static_cast<float>(n * (n - 1) / 2 + n * static_cast<int>(b));
        for (float x : buckets[b]) {
          if (x != want) throw std::runtime_error("bucket " + std::to_string(b) + " holds " +
                                                  std::to_string(x) + ", expected " +
                                                  std::to_string(want));
        }
      }
      for (double x : root_value) {
        if (x != 42.0) throw std::runtime_error("broadcast behind async work went wrong");
      }
      if (comm->seq() != 9) throw std::runtime_error("seq " + std::to_string(comm->seq()));
      comm->barrier_async()->wait();
    });
    INFO(mwms::testing::describe(results));
    for (const auto& r : results) CHECK(r.exit_code == 0);
  }
}

TEST_CASE("Work::wait rethrows the collective's error and honours its own deadline",
          "[shm][fault]") {
  LaunchOptions opts;
  opts.world_size = 2;
  opts.timeout_seconds = 60;
  auto results = run_ranks(opts, [](int rank, const std::string& tf_config, auto report) {
    auto comm = mwms::Communicator::create(mwms::resolve_tf_config(tf_config),
                                           quick(mwms::TransportChoice::kAuto, 5));
    std::vector<float> v(1 << 16, 1.0f);
    if (rank == 1) {
      ::sleep(2);
      ::raise(SIGKILL);  // never joins
    }
    auto work = comm->all_reduce_async(v.data(), v.size(), mwms::DataType::kFloat32,
                                       mwms::ReduceOp::kSum);
    try {
      work->wait(0.5);  // rank 1 is still asleep: the wait's own deadline passes first
      report("wait returned early");
    } catch (const mwms::TimeoutError& e) {
      report(std::string("wait deadline: ") + e.what());
    }
    if (work->test()) report("completed too early");
    try {
      work->wait();
      report("no error");
    } catch (const mwms::PeerError& e) {
      report(std::string("peer error: ") + e.what());
    }
  });
  INFO(mwms::testing::describe(results));
  CHECK(results[1].signal == SIGKILL);
  CHECK(results[0].exit_code == 0);
  CHECK_THAT(results[0].output, Contains("wait deadline: "));
  CHECK_THAT(results[0].output, Contains("peer error: "));
  CHECK_THAT(results[0].output, Contains("rank 1"));
  CHECK(results[0].seconds < 5);  // the death is seen long before the collective timeout
}

TEST_CASE("ranks that choose different transports fail at start-up naming both",
          "[tcp][fault]") {
  LaunchOptions opts;
  opts.world_size = 2;
  opts.timeout_seconds = 30;
  auto results = run_ranks(opts, [](int rank, const std::string& tf_config, auto) {
    auto t = rank == 0 ? mwms::TransportChoice::kTcp : mwms::TransportChoice::kShm;
    mwms::Communicator::create(mwms::resolve_tf_config(tf_config), quick(t));
  });
  INFO(mwms::testing::describe(results));
  for (const auto& r : results) {
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.output, Contains("MWMS_TRANSPORT"));
    CHECK_THAT(r.output, Contains("rank 0"));
    CHECK_THAT(r.output, Contains("rank 1"));
    CHECK(r.seconds < 10);
  }
}

TEST_CASE("an unknown forced algorithm is refused when the communicator is created",
          "[tcp][unit]") {
  mwms::CommunicatorOptions o;
  o.algorithm = "bogus";
  try {
    mwms::Communicator::create(mwms::ResolvedCluster{}, o);
    FAIL("expected InvalidArgument");
  } catch (const mwms::InvalidArgument& e) {
    std::string what = e.what();
    CHECK_THAT(what, Contains("bogus"));
    CHECK_THAT(what, Contains("all_reduce: ring"));
    CHECK_THAT(what, Contains("rhd"));
  }
  o.algorithm = "rd";  // a real name is accepted, also where a world of one never uses it
  CHECK(mwms::Communicator::create(mwms::ResolvedCluster{}, o)->world_size() == 1);
}
