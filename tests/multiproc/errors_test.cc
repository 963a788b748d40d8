// The setup errors users hit (DESIGN "Bootstrap", issue #2): a peer that never comes up, ports
// taken, clusters that differ, foreign clients, descriptor limits. Each must fail with a clear
// message naming the task and address, within its timeout, and never hang. The faults of a
// running collective (mismatch, a killed or stalled peer, abort, a partition) are in
// collective_errors_test.cc.
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
