// Liveness (issue 7): the stall warning (Note [stall warning] in engine/plan_runner.cc) names the
// rank a collective waits for and the rank that one waits for; the heartbeat (Note [heartbeat] in
// engine/control_plane.h) notices a peer frozen by SIGSTOP between collectives or inside one, and
// a collective fails at once naming it, while a peer that finalized is never reported as lost;
// the flight recorder (MWMS_TRACE_BUFFER, Note [flight recorder dump] in communicator.cc) is
// logged with the last K collectives on a timeout and on an abort, local or relayed. Real
// processes; each child's log (stderr) goes to its own file, which the parent reads.
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "multiproc/launcher.h"
#include "mwms/mwms.h"

namespace {

using Catch::Matchers::Contains;
using mwms::DataType;
using mwms::ReduceOp;
using mwms::testing::LaunchOptions;
using mwms::testing::run_ranks;

std::string temp_dir(const char* name) {
  std::string tmpl = std::string("/tmp/mwms-") + name + "-XXXXXX";
  REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
  return tmpl;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Sends this process's stderr (where libmwms logs) to `path`. Not MWMS_LOG_FILE: logging reads
// its configuration once per process, and the parent may have done so before it forked.
void capture_stderr(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0 || ::dup2(fd, 2) < 0) throw std::runtime_error("cannot redirect stderr");
  ::close(fd);
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

mwms::CommunicatorOptions options(double timeout_seconds) {
  mwms::CommunicatorOptions o;
  o.connect_timeout_seconds = 20;
  o.timeout_seconds = timeout_seconds;
  return o;
}

// dir/log-<rank>.txt: where rank's stderr goes (capture_stderr) and the parent reads it.
std::string log_of(const std::string& dir, int rank) {
  return dir + "/log-" + std::to_string(rank) + ".txt";
}

// `world_size` ranks under the launcher's default 60 s limit.
LaunchOptions ranks(int world_size) {
  LaunchOptions launch;
  launch.world_size = world_size;
  return launch;
}

void all_reduce(mwms::Communicator& comm, std::size_t count) {
  std::vector<float> v(count, 1.0f);
  comm.all_reduce(v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum);
  if (v[0] != static_cast<float>(comm.world_size())) throw std::runtime_error("wrong sum");
}

// Rank 1 of 2 freezes itself (SIGSTOP) after one all-reduce; rank 0, after `compute_seconds`
// outside any collective, calls a second all-reduce, which must fail with a PeerError (heartbeat
// every 0.5 s: lost after 2 s of silence) naming rank 1 as stalled; then rank 0 kills rank 1.
// Rank 0's output holds the error, "after <seconds> s: " before it, and "(cause stalled)" when
// ErrorContext::cause says so (Note [no finalize after a stall] reads it, not the text).
std::vector<mwms::testing::ChildResult> freeze_rank_1(const char* name, int compute_seconds) {
  const std::string dir = temp_dir(name);
  auto results = run_ranks(ranks(2), [&](int rank, const std::string& tf, auto report) {
    ::setenv("MWMS_HEARTBEAT_SECONDS", "0.5", 1);  // lost after 2 s of silence
    ::setenv("MWMS_STALL_WARN_SECONDS", "0", 1);
    auto comm = mwms::Communicator::create(mwms::resolve_tf_config(tf), options(30));
    all_reduce(*comm, 100);
    if (rank == 1) {
      std::ofstream(dir + "/pid") << ::getpid();
      ::raise(SIGSTOP);  // frozen; rank 0 kills it
      return;
    }
    if (compute_seconds > 0) ::sleep(compute_seconds);  // computing, not in a collective
    const auto start = std::chrono::steady_clock::now();
    try {
      all_reduce(*comm, 100);
      report("second all_reduce returned");
    } catch (const mwms::PeerError& e) {
      const bool stalled = e.context().cause == mwms::FailureCause::kStalled;
      report("after " + std::to_string(seconds_since(start)) + " s: " + e.what() +
             (stalled ? " (cause stalled)" : " (cause not stalled)"));
    }
    ::kill(std::stoi(read_text(dir + "/pid")), SIGKILL);
  });
  INFO(mwms::testing::describe(results));
  REQUIRE(results[0].exit_code == 0);
  const std::string& out = results[0].output;
  CHECK_THAT(out, Contains("rank 1 (worker 1, localhost:"));
  CHECK_THAT(out, Contains("sent nothing on its control connection"));
  CHECK_THAT(out, Contains("(cause stalled)"));
  REQUIRE(out.find("after ") != std::string::npos);
  return results;
}

// The seconds in rank 0's "after <seconds> s: " (freeze_rank_1).
double seconds_to_fail(const std::string& out) {
  return std::atof(out.c_str() + out.find("after ") + 6);
}

}  // namespace

TEST_CASE("the stall warning names the rank waited for and the rank that one waits for",
          "[tcp][fault][liveness]") {
  const std::string dir = temp_dir("stall");
  auto results = run_ranks(ranks(3), [&](int rank, const std::string& tf, auto) {
    capture_stderr(log_of(dir, rank));
    ::setenv("MWMS_STALL_WARN_SECONDS", "0.5", 1);
    ::setenv("MWMS_ALGO", "ring", 1);  // a chain: rank r receives from rank r - 1
    auto comm = mwms::Communicator::create(mwms::resolve_tf_config(tf), options(20));
    all_reduce(*comm, 3000);
    if (rank == 2) ::sleep(3);  // late for seq 1
    all_reduce(*comm, 3000);
    comm->finalize();
  });
  INFO(mwms::testing::describe(results));
  for (const auto& r : results) REQUIRE(r.exit_code == 0);
  const std::string log0 = read_text(log_of(dir, 0));
  const std::string log1 = read_text(log_of(dir, 1));
  INFO("rank 0:\n" << log0 << "\nrank 1:\n" << log1);
  for (const std::string& log : {log0, log1}) {
    CHECK_THAT(log, Contains("seq 1 all_reduce: waiting "));
    CHECK_THAT(log, Contains(" of 20 s for "));
    CHECK_THAT(log, Contains("rank 2 (worker 2, localhost:"));  // named with task and address
    CHECK_THAT(log, Contains("rank 2 last heard from "));       // alive: its heartbeat comes
  }
  // The rank that waits for a waiting rank names the one at the end of the chain.
  CHECK_THAT(log0 + log1, Contains(", which waits for rank 2 (worker 2, localhost:"));
  // Once per interval, not once per wait: about 3 s / 0.5 s warnings, not hundreds.
  std::size_t warnings = 0;
  for (std::size_t at = log0.find("waiting "); at != std::string::npos;
       at = log0.find("waiting ", at + 1)) {
    ++warnings;
  }
  CHECK(warnings >= 2);
  CHECK(warnings <= 8);
  CHECK_THAT(read_text(log_of(dir, 2)), !Contains("waiting "));
}

TEST_CASE("heartbeat: a peer frozen between collectives makes the next collective fail at once",
          "[tcp][fault][liveness]") {
  auto results = freeze_rank_1("frozen", 4);
  INFO(mwms::testing::describe(results));
  CHECK(results[1].signal == SIGKILL);
  CHECK_THAT(results[0].output, Contains("before all_reduce seq 1"));
  CHECK(seconds_to_fail(results[0].output) < 1.0);  // at once: not the 30 s timeout
}

TEST_CASE("heartbeat: a peer frozen while others wait for it fails them before the timeout",
          "[tcp][fault][liveness]") {
  auto results = freeze_rank_1("frozen-in", 0);  // rank 0 waits for rank 1 inside the collective
  INFO(mwms::testing::describe(results));
  CHECK_THAT(results[0].output, Contains("this rank waited for it in all_reduce seq 1"));
  const double seconds = seconds_to_fail(results[0].output);
  CHECK(seconds >= 1.9);  // 4 intervals of silence
  CHECK(seconds < 10);    // not the 30 s timeout
}

TEST_CASE("heartbeat: a peer that finalized is not reported as lost", "[tcp][liveness]") {
  const std::string dir = temp_dir("finalized");
  auto results = run_ranks(ranks(2), [&](int rank, const std::string& tf, auto report) {
    capture_stderr(log_of(dir, rank));
    ::setenv("MWMS_HEARTBEAT_SECONDS", "0.5", 1);
    auto comm = mwms::Communicator::create(mwms::resolve_tf_config(tf), options(30));
    all_reduce(*comm, 100);
    if (rank == 1) {
      comm->finalize();
      ::sleep(4);  // alive, finalized: sends no heartbeat
      return;
    }
    comm->barrier();  // pairs with rank 1's finalize
    ::sleep(4);       // twice the loss threshold
    try {
      comm->barrier();
    } catch (const mwms::CollectiveMismatchError& e) {
      report(e.what());
    }
  });
  INFO(mwms::testing::describe(results));
  for (const auto& r : results) REQUIRE(r.exit_code == 0);
  CHECK_THAT(results[0].output, Contains("rank 1 finalized after 2 collective(s)"));
  CHECK_THAT(results[0].output, !Contains("sent nothing"));
  CHECK_THAT(read_text(log_of(dir, 0)), !Contains("heartbeat"));
}

TEST_CASE("the flight recorder is logged with the last K collectives on a timeout",
          "[tcp][fault][liveness]") {
  const std::string dir = temp_dir("flight-timeout");
  auto results = run_ranks(ranks(2), [&](int rank, const std::string& tf, auto report) {
    capture_stderr(log_of(dir, rank));
    ::setenv("MWMS_TRACE_BUFFER", "3", 1);
    ::setenv("MWMS_HEARTBEAT_SECONDS", "0.5", 1);  // rank 1 reads rank 0's abort while asleep
    auto comm = mwms::Communicator::create(mwms::resolve_tf_config(tf), options(1.5));
    for (std::size_t i = 0; i < 5; ++i) all_reduce(*comm, 10 + i);
    if (rank == 1) ::sleep(4);  // alive but late: rank 0 times out in seq 5
    try {
      all_reduce(*comm, 15);
    } catch (const mwms::TimeoutError& e) {
      report(std::string("timeout: ") + e.what());  // rank 1: relayed from rank 0
    }
  });
  INFO(mwms::testing::describe(results));
  for (int rank = 0; rank < 2; ++rank) {
    REQUIRE(results[rank].exit_code == 0);
    CHECK_THAT(results[rank].output, Contains("timeout: "));
    const std::string log = read_text(log_of(dir, rank));
    INFO("rank " << rank << ":\n" << log);
    CHECK_THAT(log, Contains("flight recorder of rank " + std::to_string(rank) +
                             ": the last 3 collective(s)"));
    CHECK_THAT(log, Contains("before the failure of all_reduce seq 5"));
    CHECK_THAT(log, Contains("seq 3 all_reduce 52 bytes"));
    CHECK_THAT(log, Contains("seq 4 all_reduce 56 bytes"));
    CHECK_THAT(log, Contains("seq 5 all_reduce 60 bytes"));
    CHECK_THAT(log, Contains("FAILED"));
    CHECK_THAT(log, !Contains("seq 2 all_reduce"));  // only the last K
  }
}

TEST_CASE("the flight recorder is logged on an abort, local and relayed, naming the trace file",
          "[tcp][fault][liveness]") {
  const std::string dir = temp_dir("flight-abort");
  auto results = run_ranks(ranks(2), [&](int rank, const std::string& tf, auto report) {
    capture_stderr(log_of(dir, rank));
    ::setenv("MWMS_TRACE_BUFFER", "2", 1);
    ::setenv("MWMS_TRACE_FILE", (dir + "/trace-%r.json").c_str(), 1);
    ::setenv("MWMS_HEARTBEAT_SECONDS", "0.2", 1);
    auto comm = mwms::Communicator::create(mwms::resolve_tf_config(tf), options(20));
    if (rank == 1) {
      for (std::size_t i = 0; i < 4; ++i) all_reduce(*comm, 10 + i);
      ::usleep(300000);  // rank 0 finishes seq 3 first (an abort fails a collective at once)
      comm->abort("loss became NaN");
      ::sleep(2);  // alive: rank 0 must learn it from the abort
      return;
    }
    try {
      for (std::size_t i = 0; i < 4; ++i) all_reduce(*comm, 10 + i);
      ::usleep(800000);  // the abort arrives between collectives
      all_reduce(*comm, 14);
    } catch (const mwms::PeerError& e) {
      report(std::string("peer error: ") + e.what());
    }
  });
  INFO(mwms::testing::describe(results));
  for (const auto& r : results) REQUIRE(r.exit_code == 0);
  CHECK_THAT(results[0].output, Contains("rank 1 failed: loss became NaN"));
  const std::string log0 = read_text(log_of(dir, 0));
  const std::string log1 = read_text(log_of(dir, 1));
  INFO("rank 0:\n" << log0 << "\nrank 1:\n" << log1);
  CHECK_THAT(log1, Contains("flight recorder of rank 1: the last 2 collective(s)"));
  CHECK_THAT(log1, Contains("before abort() called by this process: loss became NaN"));
  CHECK_THAT(log1, Contains("seq 3 all_reduce 52 bytes"));
  CHECK_THAT(log1, Contains("every collective of this rank: " + dir + "/trace-1.json"));
  CHECK_THAT(log0, Contains("flight recorder of rank 0: the last 2 collective(s)"));
  CHECK_THAT(log0, Contains("rank 1 failed: loss became NaN"));
  CHECK_THAT(log0, Contains("seq 3 all_reduce 52 bytes"));
  CHECK_THAT(log0, Contains("FAILED"));  // the collective the abort failed, last
  CHECK_THAT(log0, Contains("every collective of this rank: " + dir + "/trace-0.json"));
}

// Note [dead process] (bootstrap/peer_info.cc): a rank killed while a process it forked still
// holds its sockets closes nothing. Its same-host peers must say it died, within about a second,
// not "stopped or hung" after the heartbeat's 20 s of silence (the timeout here is 30 s), on
// shared memory and over TCP, both for a rank waiting on it and for one told by the abort.
TEST_CASE("a killed rank whose forked child holds its sockets is reported dead at once",
          "[tcp][fault][liveness]") {
  for (mwms::TransportChoice transport :
       {mwms::TransportChoice::kAuto, mwms::TransportChoice::kTcp}) {
    INFO("transport " << (transport == mwms::TransportChoice::kTcp ? "tcp" : "auto (shm)"));
    LaunchOptions opts = ranks(3);
    opts.timeout_seconds = 60;
    auto results = run_ranks(opts, [&](int rank, const std::string& tf, auto report) {
      mwms::CommunicatorOptions o = options(30);
      o.transport = transport;
      auto comm = mwms::Communicator::create(mwms::resolve_tf_config(tf), o);
      all_reduce(*comm, 1000);
      if (rank == 2) {
        if (::fork() == 0) {  // keeps every descriptor of rank 2 open, writes nothing
          const int null = ::open("/dev/null", O_WRONLY);
          ::dup2(null, 1);
          ::dup2(null, 2);
          ::sleep(6);
          ::_exit(0);
        }
        ::usleep(200000);  // the others are waiting in the next all-reduce
        ::raise(SIGKILL);
      }
      const auto start = std::chrono::steady_clock::now();
      try {
        all_reduce(*comm, 1000);
        report("no error");
      } catch (const mwms::PeerError& e) {
        report(std::string("PeerError: ") + e.what());
        report("died " + std::string(e.context().cause == mwms::FailureCause::kDied ? "yes" : "no"));
      }
      report("failed after " + std::to_string(seconds_since(start)) + " s");
    });
    INFO(mwms::testing::describe(results));
    CHECK(results[2].signal == SIGKILL);
    for (int r : {0, 1}) {
      const std::string& out = results[static_cast<std::size_t>(r)].output;
      CHECK_THAT(out, Contains("PeerError: rank 2"));
      CHECK_THAT(out, Contains("died: its process (pid"));
      CHECK_THAT(out, Contains("died yes"));
      CHECK_THAT(out, !Contains("hung"));
      const double s = std::stod(out.substr(out.find("failed after ") + 13));
      CHECK(s < 5);
    }
  }
}
