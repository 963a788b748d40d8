// Orderly shutdown (Communicator::finalize, issue 7; Note [finalize] in control_plane.h): ranks
// that finalize exit cleanly whatever the order they leave in; a rank that calls a collective
// after a peer finalized learns that it finalized (not that it died) at once; a rank that exits
// WITHOUT finalize() is still named as gone within milliseconds. Over shared memory and TCP.
#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "multiproc/launcher.h"
#include "mwms/mwms.h"

namespace {

using Catch::Matchers::Contains;
using mwms::DataType;
using mwms::ReduceOp;
using mwms::testing::ChildResult;
using mwms::testing::LaunchOptions;
using mwms::testing::run_ranks;

mwms::CommunicatorOptions options(mwms::TransportChoice transport, double timeout_seconds) {
  mwms::CommunicatorOptions o;
  o.connect_timeout_seconds = 20;
  o.timeout_seconds = timeout_seconds;
  o.transport = transport;
  return o;
}

const char* name(mwms::TransportChoice t) {
  return t == mwms::TransportChoice::kShm ? "shm" : "tcp";
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Sends this process's stderr (where libmwms logs) to `path`, so the parent can check it.
void capture_stderr(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0 || ::dup2(fd, 2) < 0) throw std::runtime_error("cannot redirect stderr");
  ::close(fd);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

using Report = std::function<void(const std::string&)>;

// Forks `n` ranks; each makes a communicator over `transport` (20 s timeouts), all-reduces once
// with every other rank (seq 0), then calls body(rank, comm, report).
std::vector<ChildResult> run_after_one_all_reduce(
    int n, mwms::TransportChoice transport,
    const std::function<void(int rank, mwms::Communicator& comm, const Report& report)>& body) {
  LaunchOptions opts;
  opts.world_size = n;
  opts.timeout_seconds = 60;
  return run_ranks(opts, [&](int rank, const std::string& tf_config, const Report& report) {
    auto comm = mwms::Communicator::create(mwms::resolve_tf_config(tf_config),
                                           options(transport, 20));
    std::vector<float> v(1024, 1.0f);
    comm->all_reduce(v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum);
    body(rank, *comm, report);
  });
}

}  // namespace

TEST_CASE("ranks that all finalize exit cleanly with nothing logged", "[multiproc][finalize]") {
  for (auto transport : {mwms::TransportChoice::kShm, mwms::TransportChoice::kTcp}) {
    for (int world : {2, 4}) {
      INFO(name(transport) << ", world size " << world);
      char pattern[] = "/tmp/mwms-finalize-XXXXXX";
      const std::string logs = ::mkdtemp(pattern);
      LaunchOptions opts;
      opts.world_size = world;
      opts.timeout_seconds = 60;
      auto results = run_ranks(opts, [&](int rank, const std::string& tf_config, auto report) {
        capture_stderr(logs + "/rank" + std::to_string(rank) + ".log");
        auto comm = mwms::Communicator::create(mwms::resolve_tf_config(tf_config),
                                               options(transport, 20));
        std::vector<float> v(1 << 16, 1.0f);
        for (int i = 0; i < 3; ++i) {
          comm->all_reduce(v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum);
        }
        // Still in flight when finalize() starts: finalize waits for it first.
        std::vector<float> w(1 << 18, static_cast<float>(rank + 1));
        auto work = comm->all_reduce_async(w.data(), w.size(), DataType::kFloat32, ReduceOp::kSum);
        comm->finalize();
        if (!work->test()) throw std::runtime_error("finalize returned before the async work");
        work->wait();
        const float want = static_cast<float>(world * (world + 1) / 2);
        if (w[0] != want || w.back() != want) throw std::runtime_error("async result wrong");
        report("seq " + std::to_string(comm->seq()));
        comm->finalize();  // idempotent
        try {
          comm->barrier();
          report("barrier after finalize returned");
        } catch (const mwms::InvalidUsage& e) {
          report(std::string("after: ") + e.what());
        }
        // Ranks leave at different moments; the destructor of a finalized communicator is quiet.
        if (rank == 0) ::usleep(100000);
      });
      INFO(mwms::testing::describe(results));
      for (const ChildResult& r : results) {
        CHECK(r.exit_code == 0);
        CHECK_THAT(r.output, Contains("seq 5"));  // 3 + the async all-reduce + the barrier
        CHECK_THAT(r.output, Contains("after: communicator finalized"));
        const std::string log = read_text(logs + "/rank" + std::to_string(r.rank) + ".log");
        INFO("rank " << r.rank << " logged: " << log);
        CHECK(log.empty());
      }
    }
  }
}

TEST_CASE("a collective after a peer finalized names it as finalized, not dead",
          "[multiproc][finalize][fault]") {
  for (auto transport : {mwms::TransportChoice::kShm, mwms::TransportChoice::kTcp}) {
    INFO(name(transport));
    auto results = run_after_one_all_reduce(3, transport, [](int rank, mwms::Communicator& comm,
                                                             const Report& report) {
      if (rank == 1) {
        comm.finalize();  // seq 1: on the wire a barrier, which the others' barrier() matches
        report("finalized");
        return;  // and exits
      }
      auto start = std::chrono::steady_clock::now();
      try {
        comm.barrier();  // pairs with rank 1's finalize
        // Rank 1 will never join this one. The first rank to learn it relays its failure, so a
        // rank still finishing the barrier above may fail there, with that cause.
        comm.barrier();
        report("second barrier returned");
      } catch (const mwms::Error& e) {
        report("failed within " + std::to_string(seconds_since(start)) + " s: " + e.what());
        throw;
      }
    });
    INFO(mwms::testing::describe(results));
    CHECK(results[1].exit_code == 0);
    CHECK_THAT(results[1].output, Contains("finalized"));
    for (int r : {0, 2}) {
      CHECK(results[r].exit_code == 1);
      CHECK_FALSE(results[r].timed_out);
      CHECK_THAT(results[r].output, Contains("rank 1 finalized after 2 collective(s)"));
      CHECK_THAT(results[r].output, Contains("barrier seq 2"));
      CHECK_THAT(results[r].output, !Contains("died"));
      const auto at = results[r].output.find("failed within ");
      REQUIRE(at != std::string::npos);
      CHECK(std::atof(results[r].output.c_str() + at + 14) < 2.0);  // the timeout is 20 s
    }
  }
}

TEST_CASE("a rank that exits without finalize() while others wait is named as gone quickly",
          "[multiproc][finalize][fault]") {
  for (auto transport : {mwms::TransportChoice::kShm, mwms::TransportChoice::kTcp}) {
    INFO(name(transport));
    auto results = run_after_one_all_reduce(2, transport, [](int rank, mwms::Communicator& comm,
                                                             const Report& report) {
      if (rank == 1) return;  // leaves without finalize()
      auto start = std::chrono::steady_clock::now();
      try {
        comm.barrier();
      } catch (const mwms::PeerError& e) {
        report("after " + std::to_string(seconds_since(start)) + " s: " + e.what());
        throw;
      }
    });
    INFO(mwms::testing::describe(results));
    CHECK(results[1].exit_code == 0);
    CHECK(results[0].exit_code == 1);
    CHECK_THAT(results[0].output, Contains("rank 1"));
    CHECK_THAT(results[0].output, Contains("without finalize()"));
    CHECK_THAT(results[0].output, Contains("shut down before seq 1"));
    const auto at = results[0].output.find("after ");
    REQUIRE(at != std::string::npos);
    CHECK(std::atof(results[0].output.c_str() + at + 6) < 2.0);
  }
}

TEST_CASE("a world of one and the strategy finalize too", "[multiproc][finalize]") {
  auto comm = mwms::Communicator::create(mwms::ResolvedCluster{});
  std::vector<int> v(4, 3);
  comm->all_reduce(v.data(), v.size(), DataType::kInt32, ReduceOp::kSum);
  comm->finalize();
  comm->finalize();
  CHECK(comm->seq() == 2);
  CHECK(comm->describe() == "finalized");
  CHECK_THROWS_AS(comm->all_reduce(v.data(), v.size(), DataType::kInt32, ReduceOp::kSum),
                  mwms::InvalidUsage);
  CHECK_THROWS_WITH(comm->all_reduce_async(v.data(), v.size(), DataType::kInt32, ReduceOp::kSum),
                    Contains("communicator finalized"));
  CHECK(comm->seq() == 2);  // a refused call consumes no sequence number

  LaunchOptions opts;
  opts.world_size = 2;
  opts.timeout_seconds = 60;
  auto results = run_ranks(opts, [](int rank, const std::string& tf_config, auto report) {
    mwms::CommunicationOptions o;
    o.timeout_seconds = 20;
    mwms::MultiWorkerMirroredStrategy strategy(mwms::resolve_tf_config(tf_config), o);
    std::vector<float> g(100, static_cast<float>(rank + 1));
    strategy.all_reduce_gradients({{g.data(), g.size(), DataType::kFloat32}}, ReduceOp::kSum);
    strategy.finalize();
    try {
      strategy.reduce(ReduceOp::kSum, 1.0);
    } catch (const mwms::InvalidUsage& e) {
      report(std::string("after: ") + e.what());
    }
    report("g " + std::to_string(g[0]));
  });
  INFO(mwms::testing::describe(results));
  for (const ChildResult& r : results) {
    CHECK(r.exit_code == 0);
    CHECK_THAT(r.output, Contains("after: communicator finalized"));
    CHECK_THAT(r.output, Contains("g 3.0"));
  }
}
