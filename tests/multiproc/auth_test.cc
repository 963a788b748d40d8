// Trust at start-up (issue 7): strangers at the rendezvous and link ports, MWMS_AUTH_KEY on every
// rank, a rank with another key, the rendezvous waiting log and the follower's bounded wait. Real
// processes over loopback; strangers are made from the library's own framing and handshake.
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <vector>

#include "bootstrap/handshake.h"
#include "bootstrap/peer_info.h"
#include "bootstrap/rendezvous.h"
#include "collective/mesh/socket_mesh.h"
#include "common/socket.h"
#include "multiproc/launcher.h"
#include "mwms/mwms.h"
#include "support/handshake_peer.h"

namespace {

using Catch::Matchers::Contains;
using mwms::bootstrap::AuthKey;
using mwms::bootstrap::ConnectOutcome;
using mwms::bootstrap::HandshakeClaim;
using mwms::bootstrap::MessageKind;
using mwms::testing::ChildResult;
using mwms::testing::dial;
using mwms::testing::local_source;
using mwms::testing::LaunchOptions;
using mwms::testing::run_ranks;
using nlohmann::json;

mwms::CommunicatorOptions quick(double connect_seconds, double timeout_seconds = 10) {
  mwms::CommunicatorOptions o;
  o.connect_timeout_seconds = connect_seconds;
  o.timeout_seconds = timeout_seconds;
  o.transport = mwms::TransportChoice::kTcp;  // every link is a TCP connection with a handshake
  return o;
}

double since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A log file of this process (set before anything logs: the child reads it once).
std::string log_to_file(const std::string& name, const char* level = "warn") {
  std::string path = "/tmp/mwms-auth-test-" + std::to_string(::getpid()) + "-" + name + ".log";
  std::remove(path.c_str());
  ::setenv("MWMS_LOG_FILE", path.c_str(), 1);
  ::setenv("MWMS_LOG_LEVEL", level, 1);
  return path;
}

// The rendezvous hello task `rank` of `c` would send (what a stranger captures or forges).
std::string hello_of(const mwms::ResolvedCluster& c, int rank, const std::string& cluster_json) {
  mwms::bootstrap::PeerInfo info;
  info.rank = rank;
  info.address = c.ring[rank];
  info.host_id = mwms::bootstrap::local_host_id();
  info.transport = "tcp";
  return json{{"rank", rank},           {"peer", mwms::bootstrap::to_json(info)},
              {"world_size", c.num_workers}, {"task", c.task_name_of_rank(rank)},
              {"address", c.ring[rank]}, {"cluster", cluster_json},
              {"host", "stranger"},     {"pid", 1}}
      .dump();
}

// A stranger's rendezvous attempt without a key: the handshake passes (nothing to prove), the
// leader's answer (kept for the check) must be a refusal.
std::string stranger_hello(const mwms::ResolvedCluster& c, int rank, const std::string& cluster,
                           std::string* source) {
  auto s = dial(c.ring[0]);
  *source = local_source(s.fd());
  HandshakeClaim claim{MessageKind::kHello, rank, c.cluster.fingerprint(),
                       hello_of(c, rank, cluster)};
  auto o = mwms::bootstrap::connect_handshake(s.fd(), AuthKey(), claim,
                                              mwms::common::deadline_after(10));
  if (o.status != ConnectOutcome::Status::kOk) return "handshake failed: " + o.detail;
  MessageKind kind{};
  return mwms::testing::recv_text(s.fd(), &kind, 10);
}

std::int64_t sum_of_ranks(mwms::Communicator& comm, int rank) {
  std::vector<std::int64_t> v(7, rank + 1);
  comm.all_reduce(v.data(), v.size(), mwms::DataType::kInt64, mwms::ReduceOp::kSum);
  return v[0];
}

}  // namespace

TEST_CASE("strangers replaying or forging hellos neither take a rank nor stop the rendezvous",
          "[tcp][fault]") {
  LaunchOptions opts;
  opts.world_size = 3;
  opts.timeout_seconds = 60;
  auto results = run_ranks(opts, [](int rank, const std::string& tf_config, auto report) {
    auto cluster = mwms::resolve_tf_config(tf_config);
    std::string log = rank == 0 ? log_to_file("replay") : "";
    if (rank == 2) {
      // Worker 1 joined at once; a stranger replays its hello. Then another claims worker 2
      // (not yet arrived) with another cluster. Neither may evict, abort or delay anything.
      ::usleep(1500 * 1000);
      std::string replay_source, forged_source;
      std::string replay = stranger_hello(cluster, 1, cluster.cluster.canonical_json(),
                                          &replay_source);
      std::string forged = stranger_hello(cluster, 2, R"({"worker":["evil:1"]})", &forged_source);
      report("replay from " + replay_source + " got " + replay);
      report("forged from " + forged_source + " got " + forged);
    }
    auto comm = mwms::Communicator::create(cluster, quick(30));
    std::int64_t sum = sum_of_ranks(*comm, rank);
    if (sum != 6) throw std::runtime_error("wrong sum " + std::to_string(sum));
    if (rank == 0) report("leader log: " + read_file(log));
  });
  INFO(mwms::testing::describe(results));
  for (const ChildResult& r : results) CHECK(r.exit_code == 0);
  CHECK_THAT(results[2].output, Contains("two processes claim to be worker 1"));
  CHECK_THAT(results[2].output, Contains("cluster specs differ"));
  // The leader names each stranger by its real source address, beside what it claimed.
  auto source_of = [&](const std::string& what) {
    auto at = results[2].output.find(what + " from ");
    REQUIRE(at != std::string::npos);
    auto start = at + what.size() + 6;
    return results[2].output.substr(start, results[2].output.find(' ', start) - start);
  };
  CHECK_THAT(results[0].output, Contains("refused a connection from " + source_of("replay") +
                                         " claiming worker 1"));
  CHECK_THAT(results[0].output, Contains("refused a connection from " + source_of("forged") +
                                         " claiming worker 2"));
}

TEST_CASE("twelve silent connections delay the rendezvous by less than one hello deadline",
          "[tcp][fault]") {
  LaunchOptions opts;
  opts.world_size = 2;
  opts.timeout_seconds = 60;
  auto results = run_ranks(opts, [](int rank, const std::string& tf_config, auto report) {
    auto cluster = mwms::resolve_tf_config(tf_config);
    std::vector<mwms::common::Socket> silent;
    if (rank == 1) {
      for (int i = 0; i < 12; ++i) silent.push_back(dial(cluster.ring[0]));
    }
    auto start = std::chrono::steady_clock::now();
    auto comm = mwms::Communicator::create(cluster, quick(30));
    if (sum_of_ranks(*comm, rank) != 3) throw std::runtime_error("wrong sum");
    report("create+all_reduce " + std::to_string(since(start)) + " s");
    // Read one after another with 3 s each, they cost 36 s; concurrently, at most one deadline.
    if (since(start) > 3.0) throw std::runtime_error("silent connections held up the rendezvous");
  });
  INFO(mwms::testing::describe(results));
  for (const ChildResult& r : results) CHECK(r.exit_code == 0);
}

TEST_CASE("with MWMS_AUTH_KEY on every rank the job runs and the key is never logged",
          "[tcp][fault]") {
  LaunchOptions opts;
  opts.world_size = 3;
  opts.timeout_seconds = 60;
  auto results = run_ranks(opts, [](int rank, const std::string& tf_config, auto report) {
    const std::string key = "correct horse battery staple";
    std::string log = rank == 0 ? log_to_file("key", "info") : "";
    if (rank == 2) {
      // The same key from a file (mode 600: no warning).
      std::string path = "/tmp/mwms-auth-test-" + std::to_string(::getpid()) + ".key";
      std::ofstream(path) << key << "\n";
      ::chmod(path.c_str(), 0600);
      ::setenv("MWMS_AUTH_KEY_FILE", path.c_str(), 1);
    } else {
      ::setenv("MWMS_AUTH_KEY", key.c_str(), 1);
    }
    if (rank == 1) ::usleep(1600 * 1000);  // the leader logs that it is waiting for worker 1
    // The default transport: shared memory on this host, its addresses carried by the
    // authenticated rendezvous, and the control links over TCP through the handshake (the link
    // test below covers TCP data links with a key).
    mwms::CommunicatorOptions options = quick(30);
    options.transport = mwms::TransportChoice::kAuto;
    auto comm = mwms::Communicator::create(mwms::resolve_tf_config(tf_config), options);
    std::int64_t sum = sum_of_ranks(*comm, rank);
    if (sum != 6) throw std::runtime_error("wrong sum " + std::to_string(sum));
    if (rank == 0) {
      std::string text = read_file(log);
      if (text.find("horse") != std::string::npos) throw std::runtime_error("key in the log");
      report("leader log: " + text);
    }
  });
  INFO(mwms::testing::describe(results));
  for (const ChildResult& r : results) CHECK(r.exit_code == 0);
  CHECK_THAT(results[0].output, Contains("MWMS_AUTH_KEY (set, not shown)"));
  CHECK_THAT(results[0].output, Contains("links: 2 shm"));
  CHECK_THAT(results[0].output, Contains("rendezvous: waiting for worker 1 at localhost:"));
  CHECK_THAT(results[0].output, Contains(" s of 30 s)"));
}

TEST_CASE("a rank with another key fails fast on both sides with a key mismatch",
          "[tcp][fault]") {
  LaunchOptions opts;
  opts.world_size = 2;
  opts.timeout_seconds = 60;
  auto results = run_ranks(opts, [](int rank, const std::string& tf_config, auto) {
    ::setenv("MWMS_AUTH_KEY", rank == 1 ? "key-of-another-job" : "key-of-this-job", 1);
    mwms::Communicator::create(mwms::resolve_tf_config(tf_config), quick(30));
  });
  INFO(mwms::testing::describe(results));
  for (const ChildResult& r : results) {
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.output, Contains("key mismatch"));
    CHECK_THAT(r.output, Contains("worker 1"));
    CHECK_THAT(r.output, Contains("MWMS_AUTH_KEY"));
    CHECK(r.seconds < 15);  // not the 30 s connect timeout
  }
  CHECK_THAT(results[0].output, Contains("a connection from "));
  CHECK_THAT(results[1].output, Contains("worker 0 at localhost:"));
  // Said once: the handshake's own "key mismatch: " is not repeated inside the error's.
  const std::string& out = results[1].output;
  const auto first = out.find("key mismatch");
  CHECK(out.find("key mismatch", first + 1) == std::string::npos);
}

TEST_CASE("a stranger without the key is refused at the rendezvous and at a link port",
          "[tcp][fault]") {
  LaunchOptions opts;
  opts.world_size = 2;
  opts.timeout_seconds = 60;
  auto results = run_ranks(opts, [](int rank, const std::string& tf_config, auto report) {
    ::setenv("MWMS_AUTH_KEY", "key-of-this-job", 1);
    std::string log = rank == 0 ? log_to_file("links") : "";
    auto cluster = mwms::resolve_tf_config(tf_config);
    auto stranger = [&](MessageKind kind) {
      auto s = dial(cluster.ring[0]);
      std::string source = local_source(s.fd());
      HandshakeClaim claim{kind, 1, cluster.cluster.fingerprint(), "{}"};
      auto o = mwms::bootstrap::connect_handshake(s.fd(), AuthKey(), claim,
                                                  mwms::common::deadline_after(10));
      report(std::string(kind == MessageKind::kHello ? "rendezvous" : "link") + " stranger " +
             source + " status " + std::to_string(static_cast<int>(o.status)) + " " + o.detail);
      return source;
    };
    std::string at_rendezvous = rank == 1 ? stranger(MessageKind::kHello) : "";
    // The rendezvous and the links by hand, so that a stranger can knock between the two.
    auto rv = mwms::bootstrap::rendezvous(cluster, 30);
    std::string at_link = rank == 1 ? stranger(MessageKind::kRingControl) : "";
    mwms::collective::MeshPlan plan{{"tcp", "tcp"}, {1, 1}};  // a control link and one stream
    auto mesh = mwms::collective::connect_mesh(rv.cluster, rv.listener, plan, 30);
    if (!mesh.control[1 - rank].valid()) throw std::runtime_error("no control link");
    if (rank == 1) report("sources " + at_rendezvous + " " + at_link);
    if (rank == 0) report("leader log: " + read_file(log));
  });
  INFO(mwms::testing::describe(results));
  for (const ChildResult& r : results) CHECK(r.exit_code == 0);
  const int kKeyMismatch = static_cast<int>(ConnectOutcome::Status::kKeyMismatch);
  CHECK_THAT(results[1].output, Contains("status " + std::to_string(kKeyMismatch) +
                                         " key mismatch: the accepting side requires"));
  std::string out1 = results[1].output;
  auto at = out1.find("sources ");
  REQUIRE(at != std::string::npos);
  std::istringstream sources(out1.substr(at + 8));
  std::string rendezvous_source, link_source;
  sources >> rendezvous_source >> link_source;
  CHECK_THAT(results[0].output, Contains("refused a connection from " + rendezvous_source +
                                         " claiming worker 1: key mismatch"));
  CHECK_THAT(results[0].output, Contains("refused a link connection from " + link_source +
                                         " claiming rank 1: key mismatch"));
}

TEST_CASE("a follower waits for the leader's answer no longer than its connect timeout",
          "[tcp][fault]") {
  auto ports = mwms::testing::free_ports(2);
  // A leader that completes the handshake and then never answers (stuck, or an impostor).
  mwms::testing::TestListener listener(ports[0]);
  std::thread leader([&] {
    mwms::bootstrap::HandshakeServer server(listener.socket, AuthKey(), {MessageKind::kHello}, 3);
    auto ev = server.next(mwms::common::deadline_after(10));
    ::sleep(5);  // holds the connection open, silent
  });
  auto follower = mwms::resolve_tf_config(mwms::testing::make_tf_config(ports, 1, false));
  auto start = std::chrono::steady_clock::now();
  std::string what;
  try {
    mwms::Communicator::create(follower, quick(2));
  } catch (const mwms::BootstrapError& e) {
    what = e.what();
  }
  double seconds = since(start);
  leader.join();
  INFO(what);
  CHECK_THAT(what, Contains("got no rendezvous answer from worker 0"));
  CHECK_THAT(what, Contains(" of 2.0 s"));
  CHECK(seconds > 1.5);
  CHECK(seconds < 5.5);  // the connect timeout + the 2 s margin, not timeout + 10 s
}

TEST_CASE("a task that reconnects after its first hello takes its rank back", "[tcp][fault]") {
  LaunchOptions opts;
  opts.world_size = 3;
  opts.timeout_seconds = 60;
  auto results = run_ranks(opts, [](int rank, const std::string& tf_config, auto) {
    auto cluster = mwms::resolve_tf_config(tf_config);
    if (rank == 2) ::usleep(1500 * 1000);  // the rendezvous stays open while worker 1 comes back
    if (rank == 1) {
      // A first attempt (a task restarted by its scheduler) that joins, then goes away. Its own
      // connection closing frees the rank; a stranger's claim never would.
      auto s = dial(cluster.ring[0]);
      HandshakeClaim claim{MessageKind::kHello, 1, cluster.cluster.fingerprint(),
                           hello_of(cluster, 1, cluster.cluster.canonical_json())};
      auto o = mwms::bootstrap::connect_handshake(s.fd(), AuthKey(), claim,
                                                  mwms::common::deadline_after(10));
      if (o.status != ConnectOutcome::Status::kOk) throw std::runtime_error(o.detail);
      ::usleep(300 * 1000);
    }
    auto comm = mwms::Communicator::create(cluster, quick(20));
    if (sum_of_ranks(*comm, rank) != 6) throw std::runtime_error("wrong sum");
  });
  INFO(mwms::testing::describe(results));
  for (const ChildResult& r : results) CHECK(r.exit_code == 0);
}

TEST_CASE("MWMS_AUTH_KEY_FILE: a world-readable file warns, an empty key or both variables fail",
          "[tcp]") {
  LaunchOptions opts;
  opts.world_size = 3;
  opts.timeout_seconds = 30;
  auto results = run_ranks(opts, [](int rank, const std::string&, auto report) {
    std::string log = log_to_file("keyfile");
    std::string path = "/tmp/mwms-auth-test-" + std::to_string(::getpid()) + ".key";
    std::ofstream(path) << (rank == 1 ? "\n" : "s3cret-in-a-file\n");
    ::chmod(path.c_str(), 0644);
    ::setenv("MWMS_AUTH_KEY_FILE", path.c_str(), 1);
    if (rank == 2) ::setenv("MWMS_AUTH_KEY", "inline", 1);
    try {
      const AuthKey& key = mwms::bootstrap::auth_key_from_env();
      report("key of " + std::to_string(key.bytes().size()) + " bytes");
    } catch (const mwms::InvalidArgument& e) {
      report(std::string("InvalidArgument: ") + e.what());
    }
    report("log: " + read_file(log));
    std::remove(path.c_str());
  });
  INFO(mwms::testing::describe(results));
  CHECK_THAT(results[0].output, Contains("key of 16 bytes"));  // the newline stripped
  CHECK_THAT(results[0].output, Contains("is readable by every user"));
  CHECK_THAT(results[0].output, !Contains("s3cret"));
  CHECK_THAT(results[1].output, Contains("InvalidArgument: MWMS_AUTH_KEY_FILE"));
  CHECK_THAT(results[1].output, Contains("holds an empty key"));
  CHECK_THAT(results[2].output, Contains("both MWMS_AUTH_KEY and MWMS_AUTH_KEY_FILE are set"));
}
