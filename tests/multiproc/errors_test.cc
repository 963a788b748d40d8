// The errors users hit (DESIGN "Bootstrap", issue #2): each must fail with a clear message naming
// the task and address or the rank, within its timeout, and never hang.
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "bootstrap/rendezvous.h"
#include "common/descriptors.h"
#include "common/env.h"
#include "common/socket.h"
#include "multiproc/launcher.h"
#include "mwms/mwms.h"
#include "support/child_env.h"

namespace {

using Catch::Matchers::Contains;
using mwms::testing::ChildResult;
using mwms::testing::LaunchOptions;
using mwms::testing::run_ranks;

// These cases run over TCP (on one host the default would be shared memory, whose fault cases
// live in shm_test.cc), so that socket failures (EOF, resets) stay covered.
mwms::CommunicatorOptions quick(double connect_seconds, double timeout_seconds = 10) {
  mwms::CommunicatorOptions o;
  o.connect_timeout_seconds = connect_seconds;
  o.timeout_seconds = timeout_seconds;
  o.transport = mwms::TransportChoice::kTcp;
  return o;
}

}  // namespace

TEST_CASE("a peer that never comes up fails after the connect timeout and is named", "[tcp][fault]") {
  auto ports = mwms::testing::free_ports(2);
  // Worker 0 (the leader) waits for worker 1 that is never started.
  auto leader = mwms::resolve_tf_config(mwms::testing::make_tf_config(ports, 0, false));
  auto start = std::chrono::steady_clock::now();
  try {
    mwms::Communicator::create(leader, quick(1.5));
    FAIL("expected BootstrapError");
  } catch (const mwms::BootstrapError& e) {
    std::string what = e.what();
    CHECK_THAT(what, Contains("worker 1"));
    CHECK_THAT(what, Contains("localhost:" + std::to_string(ports[1])));
    CHECK_THAT(what, Contains("never arrived"));
    // A missed deadline is a TimeoutError too (BootstrapTimeoutError is both, issue 20).
    CHECK(dynamic_cast<const mwms::TimeoutError*>(&e) != nullptr);
  }
  // Worker 1 alone cannot reach worker 0.
  auto follower = mwms::resolve_tf_config(mwms::testing::make_tf_config(ports, 1, false));
  try {
    mwms::Communicator::create(follower, quick(1.5));
    FAIL("expected BootstrapError");
  } catch (const mwms::BootstrapError& e) {
    std::string what = e.what();
    CHECK_THAT(what, Contains("worker 0"));
    CHECK_THAT(what, Contains("localhost:" + std::to_string(ports[0])));
    CHECK_THAT(what, Contains("1.5 s"));
    CHECK(dynamic_cast<const mwms::TimeoutError*>(&e) != nullptr);
  }
  // Caught as a deadline, it keeps its bootstrap context.
  try {
    mwms::Communicator::create(follower, quick(1.0));
    FAIL("expected TimeoutError");
  } catch (const mwms::TimeoutError& e) {
    CHECK_THAT(std::string(e.what()), Contains("could not reach worker 0"));
    CHECK(dynamic_cast<const mwms::BootstrapError*>(&e) != nullptr);
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(seconds < 10);
}

TEST_CASE("a listen port already in use is reported with task and port", "[tcp][fault]") {
  auto ports = mwms::testing::free_ports(2);
  int fd = mwms::testing::bind_any(ports[1]);
  REQUIRE(fd >= 0);
  REQUIRE(::listen(fd, 4) == 0);
  auto cluster = mwms::resolve_tf_config(mwms::testing::make_tf_config(ports, 1, false));
  try {
    mwms::Communicator::create(cluster, quick(2));
    FAIL("expected BootstrapError");
  } catch (const mwms::BootstrapError& e) {
    std::string what = e.what();
    CHECK_THAT(what, Contains("worker 1"));
    CHECK_THAT(what, Contains(std::to_string(ports[1])));
    CHECK_THAT(what, Contains("already in use"));
  }
  ::close(fd);
}

// Note [listen failure reported]: a follower whose port another process holds tells the leader,
// and every task fails within seconds naming that task, its port and the cause, instead of the
// leader waiting its whole connect timeout (30 s here) for a task that "never arrived".
TEST_CASE("a worker whose port is taken makes every task fail at once naming it", "[tcp][fault]") {
  LaunchOptions opts;
  opts.world_size = 3;
  opts.timeout_seconds = 60;
  auto results = run_ranks(opts, [&](int rank, const std::string& tf_config, const auto& report) {
    auto cluster = mwms::resolve_tf_config(tf_config);
    const std::string& victim = cluster.ring[2];
    const std::string port = victim.substr(victim.rfind(':') + 1);
    int stranger = -1;
    if (rank == 2) {  // an unrelated process holding worker 2's port
      stranger = mwms::testing::bind_any(std::stoi(port));
      if (stranger < 0 || ::listen(stranger, 4) != 0) throw std::runtime_error("cannot take it");
    }
    const auto start = std::chrono::steady_clock::now();
    try {
      mwms::Communicator::create(cluster, quick(30));
      report("no error");
    } catch (const mwms::BootstrapError& e) {
      // Exit 0 with the text (exit 1 with "already in use" would make the launcher retry).
      report(std::string("error: ") + e.what() + " port " + port);
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    report("seconds " + std::to_string(s));
    if (stranger >= 0) ::close(stranger);
  });
  INFO(mwms::testing::describe(results));
  for (const ChildResult& r : results) {
    REQUIRE(r.exit_code == 0);
    const std::string& out = r.output;
    CHECK_THAT(out, Contains("error: "));
    CHECK_THAT(out, Contains("worker 2 cannot listen on port"));
    CHECK_THAT(out, Contains("already in use"));
    const double s = std::stod(out.substr(out.find("seconds ") + 8));
    CHECK(s < 10);
  }
}

// Note [leader not listening yet] (bootstrap/rendezvous.cc): a program that creates communicators
// one after another (or a session reconnecting) can reach the leader's port while the leader's
// previous listener is closing: the connection is reset, or refused by the link phase. The
// follower failed at once ("Connection reset by peer") while the leader waited its whole connect
// timeout for it; it must keep trying until the leader listens. Here the leader's port first
// resets every connection for 1.5 s.
TEST_CASE("a follower whose hellos are reset waits until the leader listens", "[tcp][fault]") {
  LaunchOptions opts;
  opts.world_size = 2;
  opts.timeout_seconds = 60;
  auto results = run_ranks(opts, [&](int rank, const std::string& tf_config, const auto& report) {
    auto cluster = mwms::resolve_tf_config(tf_config);
    if (rank == 0) {
      const std::string& own = cluster.ring[0];
      const int fd = mwms::testing::bind_any(std::stoi(own.substr(own.rfind(':') + 1)));
      if (fd < 0 || ::listen(fd, 16) != 0) throw std::runtime_error("cannot listen");
      int resets = 0;
      const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500);
      while (std::chrono::steady_clock::now() < until) {
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, 50) <= 0) continue;
        const int c = ::accept(fd, nullptr, nullptr);
        if (c < 0) continue;
        linger hard{1, 0};  // close with a reset, as a listener closing with a queued connection
        ::setsockopt(c, SOL_SOCKET, SO_LINGER, &hard, sizeof(hard));
        ::close(c);
        ++resets;
      }
      ::close(fd);
      report("resets " + std::to_string(resets) + "\n");
    }
    auto comm = mwms::Communicator::create(cluster, quick(20));
    std::int32_t v = rank + 1;
    comm->all_reduce(&v, 1, mwms::DataType::kInt32, mwms::ReduceOp::kSum);
    report("sum " + std::to_string(v));
  });
  INFO(mwms::testing::describe(results));
  REQUIRE(results.size() == 2);
  for (const ChildResult& r : results) {
    CHECK(r.exit_code == 0);
    CHECK_THAT(r.output, Contains("sum 3"));
  }
  CHECK_THAT(results[0].output, !Contains("resets 0"));
}

TEST_CASE("the test launcher runs again with fresh ports when one is taken before its bind",
          "[tcp][fault]") {
  // free_ports releases a port before the child binds it; another process on the machine can take
  // it in between (a CI failure: "cannot listen on port ...: address already in use"). Here rank 0
  // of the first run takes its own port first, as such a stranger would.
  const std::string marker = "/tmp/mwms-launcher-retry-" + std::to_string(::getpid());
  ::unlink(marker.c_str());
  LaunchOptions opts;
  opts.world_size = 3;
  opts.timeout_seconds = 60;
  opts.extra_ports = 2;
  auto results = run_ranks(opts, [&](int rank, const std::string& tf_config, const auto& report) {
    auto cluster = mwms::resolve_tf_config(tf_config);
    int stranger = -1;
    if (rank == 0 && ::access(marker.c_str(), F_OK) != 0) {
      if (FILE* f = std::fopen(marker.c_str(), "w")) std::fclose(f);
      const std::string& own = cluster.ring[0];
      stranger = mwms::testing::bind_any(std::stoi(own.substr(own.rfind(':') + 1)));
      if (stranger < 0 || ::listen(stranger, 4) != 0) throw std::runtime_error("cannot take the port");
    }
    auto comm = mwms::Communicator::create(cluster, quick(20));
    float x = static_cast<float>(rank + 1);
    comm->all_reduce(&x, 1, mwms::DataType::kFloat32, mwms::ReduceOp::kSum);
    const auto& extra = mwms::testing::extra_ports();
    report("sum " + std::to_string(static_cast<int>(x)) + " extra " + std::to_string(extra.size()));
    comm->finalize();
    if (stranger >= 0) ::close(stranger);
  });
  const bool retried = ::access(marker.c_str(), F_OK) == 0;
  ::unlink(marker.c_str());
  INFO(mwms::testing::describe(results));
  CHECK(retried);
  for (const ChildResult& r : results) {
    CHECK(r.exit_code == 0);
    CHECK(r.output.find("sum 6 extra 2") != std::string::npos);
  }
}

TEST_CASE("processes whose clusters differ fail at rendezvous naming the task", "[tcp][fault]") {
  LaunchOptions opts;
  opts.world_size = 2;
  opts.timeout_seconds = 30;
  auto results = run_ranks(opts, [](int rank, const std::string& tf_config, auto report) {
    // The leader's log goes to a file (set before anything logs: the child reads it once), read
    // 2 s into its 5 s wait: the refusal must be there already.
    const std::string log = "/tmp/mwms-errors-test-" + std::to_string(::getpid()) + ".log";
    if (rank == 0) {
      std::remove(log.c_str());
      ::setenv("MWMS_LOG_FILE", log.c_str(), 1);
      ::setenv("MWMS_LOG_LEVEL", "warn", 1);
    }
    auto cluster = mwms::resolve_tf_config(tf_config);
    if (rank == 1) {
      // Worker 1 believes there is a third worker (a stale or hand-edited TF_CONFIG).
      auto jobs = cluster.cluster.jobs();
      jobs["worker"].push_back("localhost:1");
      cluster = mwms::resolve_explicit(mwms::ClusterSpec(jobs), cluster.task);
    }
    std::thread early;
    if (rank == 0) {
      early = std::thread([&log, report] {
        std::this_thread::sleep_for(std::chrono::seconds(2));
        std::ifstream in(log);
        std::stringstream text;
        text << in.rdbuf();
        report("leader log after 2 s: " + text.str());
      });
    }
    try {
      mwms::Communicator::create(cluster, quick(5));
    } catch (...) {
      if (early.joinable()) early.join();
      std::remove(log.c_str());
      throw;
    }
    if (early.joinable()) early.join();
  });
  INFO(mwms::testing::describe(results));
  for (const ChildResult& r : results) {
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.output, Contains("worker 1"));
  }
  CHECK_THAT(results[0].output, Contains("cluster specs differ"));
  // Note [rendezvous admission]: without a key the leader waits out its connect timeout, but it
  // says so at once, and its timeout error gives the missing task the refused hello (source
  // address and reason).
  const std::string& leader = results[0].output;
  const std::size_t log_at = leader.find("leader log after 2 s: ");
  REQUIRE(log_at != std::string::npos);
  const std::string early_log = leader.substr(log_at, leader.find("\n", log_at + 30) - log_at);
  CHECK_THAT(early_log, Contains("WARN BOOT"));
  CHECK_THAT(early_log, Contains("rendezvous: refused a connection from 127.0.0.1:"));
  CHECK_THAT(early_log, Contains("still waiting for worker 1"));
  CHECK_THAT(results[0].output, Contains("every task must be started with the same cluster; still "
                                         "waiting for worker 1 at localhost:"));
  CHECK_THAT(results[0].output, Contains(" for up to 5.0 s in all (MWMS_CONNECT_TIMEOUT_SECONDS; "
                                         "without MWMS_AUTH_KEY an unproven hello cannot stop "
                                         "the job)"));
  CHECK_THAT(results[0].output, Contains("waited 5.0 s for every task to join the rendezvous; "
                                         "never arrived: worker 1 (localhost:"));
  CHECK_THAT(results[0].output, Contains(") [its hello was refused: a connection from 127.0.0.1:"));
  CHECK(results[1].seconds < 3);  // the refused worker is told why at once
}

TEST_CASE("with MWMS_AUTH_KEY a task started with another cluster stops the job at once",
          "[tcp][fault]") {
  // Note [rendezvous admission]: a hello that proved the key comes from a task of this job, so
  // its mismatch is final and nobody waits for the connect timeout (30 s here).
  LaunchOptions opts;
  opts.world_size = 2;
  opts.timeout_seconds = 60;
  auto results = run_ranks(opts, [](int rank, const std::string& tf_config, auto report) {
    if (!mwms::testing::set_env_in_child("MWMS_AUTH_KEY", "a shared test key", report)) return;
    auto cluster = mwms::resolve_tf_config(tf_config);
    if (rank == 1) {
      auto jobs = cluster.cluster.jobs();
      jobs["worker"].push_back("localhost:1");
      cluster = mwms::resolve_explicit(mwms::ClusterSpec(jobs), cluster.task);
    }
    mwms::Communicator::create(cluster, quick(30));
  });
  INFO(mwms::testing::describe(results));
  if (mwms::testing::skipped_for_cached_env(results)) return;
  for (const ChildResult& r : results) {
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.output, Contains("cluster specs differ: worker 1 (localhost:"));
    CHECK(r.seconds < 10);
  }
}

TEST_CASE("calls that disagree across ranks raise CollectiveMismatchError", "[tcp][fault]") {
  // Rank 2 disagrees in one way per launch: count (a classic bug: uneven last batch), dtype, op.
  struct Variant {
    const char* name;
    std::size_t count;
    mwms::DataType dtype;
    mwms::ReduceOp op;
    const char* named;  // what the message must show of rank 2's call
  };
  const Variant variants[] = {
      {"count", 63, mwms::DataType::kFloat32, mwms::ReduceOp::kSum, "count 63"},
      {"dtype", 64, mwms::DataType::kInt32, mwms::ReduceOp::kSum, "int32"},
      {"op", 64, mwms::DataType::kFloat32, mwms::ReduceOp::kMax, "max"},
  };
  for (const Variant& bad : variants) {
    INFO("rank 2 passes a different " << bad.name);
    LaunchOptions opts;
    opts.world_size = 3;
    opts.timeout_seconds = 30;
    auto results = run_ranks(opts, [&bad](int rank, const std::string& tf_config, auto report) {
      auto comm = mwms::Communicator::create(mwms::resolve_tf_config(tf_config), quick(10));
      std::vector<float> v(64, 1.0f);
      try {
        // A rank still finishing the first call may learn of the mismatch there (relayed).
        comm->all_reduce(v.data(), v.size(), mwms::DataType::kFloat32, mwms::ReduceOp::kSum);
        if (rank == 2) {
          comm->all_reduce(v.data(), bad.count, bad.dtype, bad.op);
        } else {
          comm->all_reduce(v.data(), 64, mwms::DataType::kFloat32, mwms::ReduceOp::kSum);
        }
      } catch (const mwms::CollectiveMismatchError& e) {
        report(std::string("mismatch: ") + e.what());
        throw;
      }
    });
    INFO(mwms::testing::describe(results));
    for (const ChildResult& r : results) {
      CHECK(r.exit_code == 1);
      CHECK_THAT(r.output, Contains("mismatch: "));
      CHECK_THAT(r.output, Contains(bad.named));
    }
  }
}

TEST_CASE("a barrier that disagrees across ranks shows what differs on each side", "[tcp][fault]") {
  // Note [mismatch text] in src/collective/frame.cc. A barrier runs the all-reduce algorithms, so
  // ranks forcing different ones disagree on barrier calls that otherwise look alike: each side
  // must show its algorithm tag and the text must say what differs, not print two like barriers.
  struct Variant {
    const char* name;
    bool rank1_all_reduce;   // rank 1 calls a one-int32 all_reduce instead of the barrier
    const char* rank0_sees;  // rank 0 forces ring
    const char* rank1_sees;  // rank 1 forces rd
  };
  const Variant variants[] = {
      {"algorithm", false,
       "this rank called barrier() seq 0 [ring] but peer rank 1 called barrier() seq 0 [rd] "
       "(they differ in algorithm)",
       "this rank called barrier() seq 0 [rd] but peer rank 0 called barrier() seq 0 [ring] "
       "(they differ in algorithm)"},
      {"collective", true,
       "this rank called barrier() seq 0 [ring] but peer rank 1 called all_reduce(count 1, int32, "
       "sum) seq 0 [rd] (they differ in collective, algorithm)",
       "this rank called all_reduce(count 1, int32, sum) seq 0 [rd] but peer rank 0 called "
       "barrier() seq 0 [ring] (they differ in collective, algorithm)"},
  };
  for (const Variant& bad : variants) {
    INFO("the ranks differ in " << bad.name);
    LaunchOptions opts;
    opts.world_size = 2;
    opts.timeout_seconds = 30;
    auto results = run_ranks(opts, [&bad](int rank, const std::string& tf_config, auto report) {
      mwms::CommunicatorOptions o = quick(10);
      o.algorithm = rank == 0 ? "ring" : "rd";
      auto comm = mwms::Communicator::create(mwms::resolve_tf_config(tf_config), o);
      std::int32_t one = 1;
      try {
        if (rank == 1 && bad.rank1_all_reduce) {
          comm->all_reduce(&one, 1, mwms::DataType::kInt32, mwms::ReduceOp::kSum);
        } else {
          comm->barrier();
        }
      } catch (const mwms::CollectiveMismatchError& e) {
        report(std::string("mismatch: ") + e.what());
        throw;
      }
    });
    INFO(mwms::testing::describe(results));
    REQUIRE(results.size() == 2);
    CHECK(results[0].exit_code == 1);
    CHECK(results[1].exit_code == 1);
    // Whichever rank reads the other's frame first reports the mismatch itself; the other may
    // learn of it through the relayed abort, which carries the first rank's text.
    const bool rank0_saw = results[0].output.find(bad.rank0_sees) != std::string::npos ||
                           results[1].output.find(bad.rank0_sees) != std::string::npos;
    const bool rank1_saw = results[0].output.find(bad.rank1_sees) != std::string::npos ||
                           results[1].output.find(bad.rank1_sees) != std::string::npos;
    CHECK((rank0_saw || rank1_saw));
    for (const ChildResult& r : results) CHECK_THAT(r.output, Contains("mismatch: "));
  }
}

TEST_CASE("a peer killed in the middle of an all-reduce makes every survivor fail naming it",
          "[tcp][fault]") {
  LaunchOptions opts;
  opts.world_size = 4;
  opts.timeout_seconds = 60;
  auto results = run_ranks(opts, [](int rank, const std::string& tf_config, auto) {
    auto comm = mwms::Communicator::create(mwms::resolve_tf_config(tf_config), quick(10, 20));
    std::vector<float> v(1 << 20, 1.0f);
    for (int iter = 0; iter < 1000; ++iter) {
      if (rank == 2 && iter == 3) ::raise(SIGKILL);
      comm->all_reduce(v.data(), v.size(), mwms::DataType::kFloat32, mwms::ReduceOp::kMean);
      // Every result that is returned is right (the mean of ones, exact), until one fails.
      if (v.front() != 1.0f || v[v.size() / 2] != 1.0f || v.back() != 1.0f) {
        throw std::runtime_error("wrong result at iteration " + std::to_string(iter));
      }
    }
  });
  INFO(mwms::testing::describe(results));
  CHECK(results[2].signal == SIGKILL);
  for (int r : {0, 1, 3}) {
    CHECK(results[r].exit_code == 1);
    CHECK_FALSE(results[r].timed_out);
    CHECK_THAT(results[r].output, Contains("rank 2"));
    CHECK(results[r].seconds < 20);  // well inside the collective timeout
  }
}

TEST_CASE("a stalled peer makes the others time out and is named", "[tcp][fault][slow]") {
  LaunchOptions opts;
  opts.world_size = 3;
  opts.timeout_seconds = 60;
  auto results = run_ranks(opts, [](int rank, const std::string& tf_config, auto) {
    auto comm = mwms::Communicator::create(mwms::resolve_tf_config(tf_config), quick(10, 2));
    std::vector<float> v(1024, 1.0f);
    comm->all_reduce(v.data(), v.size(), mwms::DataType::kFloat32, mwms::ReduceOp::kSum);
    if (rank == 1) {
      ::sleep(8);  // never joins the second all-reduce in time
      return;
    }
    comm->all_reduce(v.data(), v.size(), mwms::DataType::kFloat32, mwms::ReduceOp::kSum);
  });
  INFO(mwms::testing::describe(results));
  for (int r : {0, 2}) {
    CHECK(results[r].exit_code == 1);
    CHECK_THAT(results[r].output, Contains("rank 1"));
    CHECK(results[r].seconds < 7);
  }
}

TEST_CASE("a poisoned communicator fails fast with the original cause", "[tcp][fault]") {
  LaunchOptions opts;
  opts.world_size = 2;
  opts.timeout_seconds = 30;
  auto results = run_ranks(opts, [](int rank, const std::string& tf_config, auto report) {
    auto comm = mwms::Communicator::create(mwms::resolve_tf_config(tf_config), quick(10, 5));
    std::vector<double> v(8, 1.0);
    if (rank == 1) return;  // exits: rank 0's all-reduce fails
    try {
      comm->all_reduce(v.data(), v.size(), mwms::DataType::kFloat64, mwms::ReduceOp::kSum);
    } catch (const mwms::PeerError&) {
    }
    try {
      comm->barrier();
    } catch (const mwms::InvalidUsage& e) {
      report(std::string("poisoned: ") + e.what());
    }
  });
  INFO(mwms::testing::describe(results));
  CHECK(results[0].exit_code == 0);
  CHECK_THAT(results[0].output, Contains("poisoned: "));
  CHECK_THAT(results[0].output, Contains("rank 1"));
}

TEST_CASE("silent and foreign clients at a listener do not stop the rendezvous", "[tcp][fault]") {
  LaunchOptions opts;
  opts.world_size = 3;
  opts.timeout_seconds = 60;
  auto results = run_ranks(opts, [](int rank, const std::string& tf_config, auto report) {
    auto cluster = mwms::resolve_tf_config(tf_config);
    std::vector<mwms::common::Socket> strays;
    if (rank == 1) {
      // A port scanner that connects and says nothing, and a client that speaks our framing
      // with nonsense inside, both aimed at the leader (worker 0) before rank 1 joins.
      auto [host, port] = mwms::split_address(cluster.ring[0]);
      std::string err;
      auto deadline = mwms::common::deadline_after(20);
      strays.push_back(mwms::common::connect_tcp(host, port, deadline, &err));
      strays.push_back(mwms::common::connect_tcp(host, port, deadline, &err));
      mwms::bootstrap::send_message(strays.back().fd(), mwms::bootstrap::MessageKind::kHello,
                                    R"({"rank":"1","task":7})", deadline);
    }
    auto start = std::chrono::steady_clock::now();
    auto comm = mwms::Communicator::create(cluster, quick(30, 10));
    std::vector<std::int64_t> v(5, rank + 1);
    comm->all_reduce(v.data(), v.size(), mwms::DataType::kInt64, mwms::ReduceOp::kSum);
    if (v[0] != 6) throw std::runtime_error("wrong sum " + std::to_string(v[0]));
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    report("create+all_reduce " + std::to_string(seconds) + " s");
    if (seconds > 8) throw std::runtime_error("strays held up the rendezvous");
  });
  INFO(mwms::testing::describe(results));
  for (const ChildResult& r : results) CHECK(r.exit_code == 0);
}

TEST_CASE("abort tells the peers which rank gave up and why", "[tcp][fault]") {
  LaunchOptions opts;
  opts.world_size = 3;
  opts.timeout_seconds = 30;
  auto results = run_ranks(opts, [](int rank, const std::string& tf_config, auto report) {
    auto comm = mwms::Communicator::create(mwms::resolve_tf_config(tf_config), quick(10, 10));
    std::vector<float> v(16, 1.0f);
    if (rank == 1) {
      comm->abort("loss became NaN at step 7");
      ::sleep(2);  // stay alive: the peers must learn it from the abort, not from a closed socket
      try {
        comm->barrier();
      } catch (const mwms::InvalidUsage& e) {
        report(std::string("self: ") + e.what());
      }
      return;
    }
    comm->all_reduce(v.data(), v.size(), mwms::DataType::kFloat32, mwms::ReduceOp::kSum);
  });
  INFO(mwms::testing::describe(results));
  CHECK(results[1].exit_code == 0);
  CHECK_THAT(results[1].output, Contains("self: "));
  for (int r : {0, 2}) {
    CHECK(results[r].exit_code == 1);
    CHECK_THAT(results[r].output, Contains("rank 1 failed: loss became NaN at step 7"));
    CHECK(results[r].seconds < 2);
  }
}

TEST_CASE("abort from another thread fails this rank's own blocked collective at once",
          "[tcp][fault]") {
  // Note [local abort]: rank 1 never joins; rank 0's all_reduce would wait for its 30 s
  // deadline, but a second thread of rank 0 aborts after 0.3 s (as a signal watcher does).
  const mwms::TransportChoice transport =
      GENERATE(mwms::TransportChoice::kTcp, mwms::TransportChoice::kShm);
  LaunchOptions opts;
  opts.world_size = 2;
  opts.timeout_seconds = 60;
  auto results = run_ranks(opts, [transport](int rank, const std::string& tf_config, auto report) {
    mwms::CommunicatorOptions o = quick(10, 30);
    o.transport = transport;
    auto comm = mwms::Communicator::create(mwms::resolve_tf_config(tf_config), o);
    if (rank == 1) {
      ::sleep(3);
      return;
    }
    std::vector<float> v(1024, 1.0f);
    const auto start = std::chrono::steady_clock::now();
    std::thread watcher([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      comm->abort("interrupted by the user");
    });
    try {
      comm->all_reduce(v.data(), v.size(), mwms::DataType::kFloat32, mwms::ReduceOp::kSum);
      report("all_reduce returned");
    } catch (const mwms::InvalidUsage& e) {
      const double s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      report(std::string("stopped after ") + (s < 1.5 ? "under 1.5 s: " : "too long: ") +
             e.what());
    }
    watcher.join();
    try {
      comm->barrier();
    } catch (const mwms::InvalidUsage& e) {
      report(std::string("then: ") + e.what());
    }
  });
  INFO(mwms::testing::describe(results));
  CHECK(results[0].exit_code == 0);
  CHECK(results[1].exit_code == 0);
  CHECK_THAT(results[0].output,
             Contains("stopped after under 1.5 s: communicator aborted by this process while "
                      "rank 0 waited in all_reduce seq 0: interrupted by the user"));
  // The poisoned communicator repeats the abort's own reason, not the error it caused.
  CHECK_THAT(results[0].output,
             Contains("then: communicator is unusable after an earlier failure; rebuild it "
                      "(restart the job): aborted by this process: interrupted by the user"));
}

TEST_CASE("ranks opening different numbers of TCP streams fail naming MWMS_NSOCKS_PERPEER",
          "[tcp][fault]") {
  LaunchOptions opts;
  opts.world_size = 2;
  opts.timeout_seconds = 60;
  auto results = run_ranks(opts, [](int rank, const std::string& tf_config, auto report) {
    if (!mwms::testing::set_env_in_child("MWMS_NSOCKS_PERPEER", rank == 1 ? "2" : "1", report)) {
      return;
    }
    mwms::Communicator::create(mwms::resolve_tf_config(tf_config), quick(5, 5));
    report("created");
  });
  INFO(mwms::testing::describe(results));
  if (mwms::testing::skipped_for_cached_env(results)) return;
  // Note [stream count agreement]: both ends read both counts from the peer-info exchange, so
  // each names the variable, both values and the other end, at once (not "did not confirm its
  // links" at the end of the connect timeout on the connecting side).
  const std::string both =
      "MWMS_NSOCKS_PERPEER differs between the ends of a TCP pair: ";
  CHECK(results[0].exit_code == 1);
  CHECK_THAT(results[0].output, Contains(both + "worker 1 (rank 1 at localhost:"));
  CHECK_THAT(results[0].output, Contains(") has MWMS_NSOCKS_PERPEER=2, worker 0 (rank 0, this "
                                         "task) has MWMS_NSOCKS_PERPEER=1; MWMS_NSOCKS_PERPEER "
                                         "must be the same on every rank"));
  CHECK(results[1].exit_code == 1);
  CHECK_THAT(results[1].output, Contains(both + "worker 0 (rank 0 at localhost:"));
  CHECK_THAT(results[1].output, Contains(") has MWMS_NSOCKS_PERPEER=1, worker 1 (rank 1, this "
                                         "task) has MWMS_NSOCKS_PERPEER=2; MWMS_NSOCKS_PERPEER "
                                         "must be the same on every rank"));
  for (const ChildResult& r : results) {
    CHECK_THAT(r.output, !Contains("did not confirm its links"));
    CHECK(r.seconds < 4);  // before the 5 s connect timeout: nothing waited
  }
}

// Hidden ([.partition]): needs 3 test hosts (tests/tools/netns_hosts.sh run 3 -- ...), run by the
// netns:partition CTest test with a short MWMS_TIMEOUT_SECONDS. Unlike a killed peer, a host cut
// off the network closes nothing: its sockets stay open, packets to it are dropped silently and
// no RST ever comes back, so the survivors can only learn of it through their deadlines and the
// stall notices on the control links they still share. Each must fail naming the host that was
// cut off (its rank and its address) within about the timeout, not hang and not blame another.
TEST_CASE("a host cut off mid all-reduce makes every other rank fail naming it", "[.partition]") {
  const auto& hosts = mwms::testing::test_hosts();
  REQUIRE(hosts.size() == 3);
  const char* timeout_env = std::getenv("MWMS_TIMEOUT_SECONDS");
  REQUIRE(timeout_env != nullptr);
  const double timeout = std::atof(timeout_env);
  REQUIRE(timeout > 0);
  // The bridge-side end of host 2's veth ("h2" in the switch namespace PREFIXsw, where host 2's
  // namespace is PREFIXh2: tests/tools/netns_hosts.sh).
  const std::string ns = hosts[2].netns;
  const std::string sw = ns.substr(0, ns.rfind('h')) + "sw";
  const std::string cut = "ip -n " + sw + " link set h2 down";
  LaunchOptions opts;
  opts.world_size = 3;  // one rank per host: every pair talks TCP across the bridge
  opts.timeout_seconds = 60;
  auto results = run_ranks(opts, [&](int rank, const std::string& tf_config, auto report) {
    mwms::CommunicatorOptions o;
    o.connect_timeout_seconds = 20;  // timeout_seconds left 0: MWMS_TIMEOUT_SECONDS applies
    auto comm = mwms::Communicator::create(mwms::resolve_tf_config(tf_config), o);
    std::vector<float> v(1 << 20, 1.0f);  // 4 MiB: the ring, bytes in flight on every link
    for (int iter = 0; iter < 100000; ++iter) {
      if (rank == 2 && iter == 5) {
        if (std::system(cut.c_str()) != 0) throw std::runtime_error("could not run: " + cut);
        report("cut at iteration " + std::to_string(iter));
      }
      comm->all_reduce(v.data(), v.size(), mwms::DataType::kFloat32, mwms::ReduceOp::kMean);
      // Every result that is returned is right (the mean of ones, exact), until one fails.
      if (v.front() != 1.0f || v[v.size() / 2] != 1.0f || v.back() != 1.0f) {
        throw std::runtime_error("wrong result at iteration " + std::to_string(iter));
      }
    }
  });
  INFO(mwms::testing::describe(results));
  CHECK_THAT(results[2].output, Contains("cut at iteration 5"));
  for (int r : {0, 1}) {
    CHECK(results[r].exit_code == 1);
    CHECK_FALSE(results[r].timed_out);
    CHECK_THAT(results[r].output, Contains("peer rank 2 (worker 2 at " + hosts[2].address + ":"));
    CHECK_THAT(results[r].output, !Contains("wrong result"));
    // Connect, five all-reduces, the cut, then at most a timeout and the abort relay (~1 s).
    CHECK(results[r].seconds < timeout + 10);
  }
}

// Note [descriptor budget]: a rank whose `ulimit -n` cannot hold what this job needs makes every
// task fail at once, before anything connects, naming it, its headroom, the need and its parts,
// instead of failing mid-connect while its peers wait out the connect timeout (30 s here).
TEST_CASE("a rank short of file descriptors makes every task fail at once naming the limit",
          "[tcp][fault]") {
  ::setenv("MWMS_NSOCKS_PERPEER", "3", 1);
  if (mwms::common::env_int("MWMS_NSOCKS_PERPEER") != 3) {
    WARN("skipped: this test binary read MWMS_NSOCKS_PERPEER before; run this case alone");
    return;
  }
  for (int victim : {1, 0}) {
    INFO("rank with the low limit: " << victim);
    LaunchOptions opts;
    opts.world_size = 4;
    opts.timeout_seconds = 60;
    auto results = run_ranks(opts, [&](int rank, const std::string& tf_config, const auto& report) {
      if (rank == victim) {  // room for 10 more: 4 ranks x 3 streams need 18
        rlimit r{};
        ::getrlimit(RLIMIT_NOFILE, &r);
        r.rlim_cur = static_cast<rlim_t>(mwms::common::open_descriptors() + 10);
        if (::setrlimit(RLIMIT_NOFILE, &r) != 0) throw std::runtime_error("setrlimit failed");
      }
      const auto start = std::chrono::steady_clock::now();
      try {
        mwms::Communicator::create(mwms::resolve_tf_config(tf_config), quick(30));
        report("no error");
      } catch (const mwms::BootstrapError& e) {
        report(std::string("error: ") + e.what());
      }
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      report("seconds " + std::to_string(s));
    });
    INFO(mwms::testing::describe(results));
    for (const ChildResult& r : results) {
      REQUIRE(r.exit_code == 0);
      const std::string& out = r.output;
      CHECK_THAT(out, Contains("error: out of file descriptors: worker " + std::to_string(victim)));
      CHECK_THAT(out, Contains("more file descriptors under its limit (ulimit -n) but "
                               "needs 18 for this job: 1 listener, 3 control links, 9 TCP streams "
                               "to 3 peers (MWMS_NSOCKS_PERPEER=3), 3 epoll sets"));
      CHECK(std::stod(out.substr(out.find("seconds ") + 8)) < 10);
    }
  }
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  return;  // a sanitizer's runtime may need descriptors of its own
#endif
  // The need is what the job really opens: with room for exactly 18, it runs.
  LaunchOptions opts;
  opts.world_size = 4;
  opts.timeout_seconds = 60;
  auto results = run_ranks(opts, [&](int rank, const std::string& tf_config, const auto& report) {
    if (rank == 1) {
      rlimit r{};
      ::getrlimit(RLIMIT_NOFILE, &r);
      r.rlim_cur = static_cast<rlim_t>(mwms::common::open_descriptors() + 18);
      if (::setrlimit(RLIMIT_NOFILE, &r) != 0) throw std::runtime_error("setrlimit failed");
    }
    auto comm = mwms::Communicator::create(mwms::resolve_tf_config(tf_config), quick(30));
    std::vector<float> v(100000, static_cast<float>(rank + 1));
    comm->all_reduce(v.data(), v.size(), mwms::DataType::kFloat32, mwms::ReduceOp::kSum);
    report("sum " + std::to_string(static_cast<int>(v[99999])));
    comm->finalize();
  });
  INFO(mwms::testing::describe(results));
  for (const ChildResult& r : results) {
    REQUIRE(r.exit_code == 0);
    CHECK_THAT(r.output, Contains("sum 10"));
  }
}
