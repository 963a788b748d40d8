// The shared-memory transport (transport/shm/) on 2, 3 and 4 real processes: every collective
// checked against exact expected values and byte-identical across ranks, the faults shared
// memory cannot see by itself (a killed or stopped peer), stale and foreign segment addresses,
// MWMS_SHM_DISABLE, and the steady-state no-allocation rule over shm.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "collective/transport/shm/shm_segment.h"
#include "kernels/reduce.h"
#include "multiproc/launcher.h"
#include "mwms/mwms.h"
#include "support/child_env.h"
#include "support/values.h"

namespace {

using mwms::testing::input_value;
using mwms::testing::store;

using Catch::Matchers::Contains;
using mwms::DataType;
using mwms::ReduceOp;
using mwms::testing::ChildResult;
using mwms::testing::LaunchOptions;
using mwms::testing::run_ranks;

const DataType kTypes[] = {DataType::kFloat32,  DataType::kFloat64, DataType::kFloat16,
                           DataType::kBFloat16, DataType::kInt32,   DataType::kInt64};
const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProd};

mwms::CommunicatorOptions shm_options(double timeout_seconds = 30) {
  mwms::CommunicatorOptions o;
  o.transport = mwms::TransportChoice::kShm;
  o.connect_timeout_seconds = 20;
  o.timeout_seconds = timeout_seconds;
  return o;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

double reference(int n, std::size_t i, ReduceOp op) {
  double acc = input_value(0, i, op);
  for (int r = 1; r < n; ++r) {
    double v = input_value(r, i, op);
    if (op == ReduceOp::kSum) acc += v;
    if (op == ReduceOp::kMin) acc = std::min(acc, v);
    if (op == ReduceOp::kMax) acc = std::max(acc, v);
    if (op == ReduceOp::kProd) acc *= v;
  }
  return acc;
}

// Compares bytes with the encoding of the expected values (exact: every value is representable).
void expect(const char* what, DataType t, const std::vector<char>& got, std::size_t count,
            const std::function<double(std::size_t)>& want) {
  const std::size_t es = mwms::dtype_size(t);
  std::vector<char> ref(es);
  for (std::size_t i = 0; i < count; ++i) {
    store(t, ref.data(), 0, want(i));
    if (std::memcmp(ref.data(), got.data() + i * es, es) != 0) {
      throw std::runtime_error(std::string(what) + " " + std::string(mwms::to_string(t)) +
                               " count " + std::to_string(count) + ": element " +
                               std::to_string(i) + " differs from " + std::to_string(want(i)));
    }
  }
}

std::uint64_t fnv(std::uint64_t h, const std::vector<char>& bytes) {
  for (char c : bytes) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ULL;
  return h;
}

// Runs every collective; returns a digest of the results that must be equal on every rank.
std::uint64_t run_collectives(mwms::Communicator& comm) {
  const int n = comm.world_size();
  const int me = comm.rank();
  std::uint64_t digest = 0xcbf29ce484222325ULL;
  const std::size_t counts[] = {0, 1, 7, 1000003};
  for (DataType t : kTypes) {
    const std::size_t es = mwms::dtype_size(t);
    for (ReduceOp op : kOps) {
      for (std::size_t count : counts) {
        if (count > 7 && op != ReduceOp::kSum && op != ReduceOp::kMax) continue;
        std::vector<char> buf(count * es);
        for (std::size_t i = 0; i < count; ++i) store(t, buf.data(), i, input_value(me, i, op));
        comm.all_reduce(buf.data(), count, t, op);
        expect("all_reduce", t, buf, count, [&](std::size_t i) { return reference(n, i, op); });
        digest = fnv(digest, buf);
        const std::size_t block = count == 1000003 ? 250007 : count;
        std::vector<char> send(block * n * es), recv(block * es);
        for (std::size_t i = 0; i < block * n; ++i)
          store(t, send.data(), i, input_value(me, i, op));
        comm.reduce_scatter(send.data(), recv.data(), block, t, op);
        expect("reduce_scatter", t, recv, block,
               [&](std::size_t i) { return reference(n, block * me + i, op); });
      }
    }
    for (std::size_t block : counts) {
      std::vector<char> send(block * es), recv(block * n * es);
      for (std::size_t i = 0; i < block; ++i)
        store(t, send.data(), i, input_value(me, i, ReduceOp::kSum));
      comm.all_gather(send.data(), recv.data(), block, t);
      expect("all_gather", t, recv, block * n, [&](std::size_t i) {
        return input_value(static_cast<int>(i / block), i % block, ReduceOp::kSum);
      });
      digest = fnv(digest, recv);
      for (int root = 0; root < n; ++root) {
        std::vector<char> buf(block * es);
        for (std::size_t i = 0; i < block; ++i)
          store(t, buf.data(), i, input_value(me, i, ReduceOp::kSum));
        comm.broadcast(buf.data(), block, t, root);
        expect("broadcast", t, buf, block,
               [&](std::size_t i) { return input_value(root, i, ReduceOp::kSum); });
        digest = fnv(digest, buf);
      }
    }
    comm.barrier();
  }
  return digest;
}

void run_everything_over_shm(int world_size, bool with_chief, long long small_message_bytes) {
  LaunchOptions opts;
  opts.world_size = world_size;
  opts.with_chief = with_chief;
  opts.timeout_seconds = 300;
  auto results = run_ranks(opts, [&](int, const std::string& tf_config, auto report) {
    mwms::CommunicatorOptions copts = shm_options(60);
    copts.small_message_bytes = small_message_bytes;
    auto comm = mwms::Communicator::create(mwms::resolve_tf_config(tf_config), copts);
    if (comm->describe().find("shm") == std::string::npos) {
      throw std::runtime_error("not over shared memory: " + comm->describe());
    }
    report("digest " + std::to_string(run_collectives(*comm)));
  });
  INFO(mwms::testing::describe(results));
  for (const ChildResult& r : results) {
    REQUIRE(r.exit_code == 0);
    CHECK(r.output == results[0].output);  // byte-identical results on every rank
  }
}

}  // namespace

TEST_CASE("every collective over shm on 2 processes", "[shm][multiproc]") {
  run_everything_over_shm(2, false, -1);
  run_everything_over_shm(2, false, 0);
}

TEST_CASE("every collective over shm on 3 processes (chief + 2 workers)", "[shm][multiproc]") {
  run_everything_over_shm(3, true, -1);
}

TEST_CASE("every collective over shm on 4 processes", "[shm][multiproc]") {
  run_everything_over_shm(4, false, -1);
  run_everything_over_shm(4, false, 0);
}

TEST_CASE("steady-state collectives over shm allocate nothing", "[shm][multiproc]") {
  LaunchOptions opts;
  opts.world_size = 3;
  opts.timeout_seconds = 60;
  auto results = run_ranks(opts, [](int, const std::string& tf_config, auto report) {
    auto comm = mwms::Communicator::create(mwms::resolve_tf_config(tf_config), shm_options());
    const std::size_t n = static_cast<std::size_t>(comm->world_size());
    std::vector<float> big((1u << 20) * n), small(100 * n), out(1u << 20);
    auto round = [&] {
      comm->all_reduce(big.data(), big.size(), DataType::kFloat32, ReduceOp::kMean);  // ring
      comm->all_reduce(small.data(), 100, DataType::kFloat16, ReduceOp::kSum);        // gather
      comm->reduce_scatter(big.data(), out.data(), 1u << 20, DataType::kFloat32, ReduceOp::kSum);
      comm->all_gather(out.data(), big.data(), 1u << 20, DataType::kFloat32);
      comm->broadcast(small.data(), small.size(), DataType::kFloat32, /*root=*/1);
      comm->barrier();
    };
    mwms::testing::expect_no_allocations(round, report);
  });
  INFO(mwms::testing::describe(results));
  for (const ChildResult& r : results) REQUIRE(r.exit_code == 0);
}

// Resident bytes of this process's mappings of shared-memory segments (/proc/self/smaps).
std::size_t shm_resident_bytes() {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool in_segment = false;
  std::size_t kib = 0;
  while (std::getline(smaps, line)) {
    if (!line.empty() && std::isxdigit(static_cast<unsigned char>(line[0])) &&
        line.find('-') != std::string::npos && line.find(' ') != std::string::npos) {
      in_segment = line.find("mwms-shm") != std::string::npos;  // a new mapping's first line
    } else if (in_segment && line.rfind("Rss:", 0) == 0) {
      kib += std::stoul(line.substr(4));
    }
  }
  return kib * 1024;
}

TEST_CASE("the shm rings are mapped in at start-up, not page by page in the first collectives",
          "[shm][multiproc]") {
  // Note [shm prefault]: each rank's mappings hold its inbound ring from the peer and the ring
  // it writes in the peer's segment, resident before the first collective touches them.
  LaunchOptions opts;
  opts.world_size = 2;
  opts.timeout_seconds = 60;
  auto results = run_ranks(opts, [](int, const std::string& tf_config, auto report) {
    auto comm = mwms::Communicator::create(mwms::resolve_tf_config(tf_config), shm_options());
    report("resident " + std::to_string(shm_resident_bytes()));
    comm->finalize();
  });
  INFO(mwms::testing::describe(results));
  const std::size_t ring = std::size_t{1} << 20;  // MWMS_SHM_RING_BYTES' default
  for (const ChildResult& r : results) {
    REQUIRE(r.exit_code == 0);
    const std::size_t at = r.output.find("resident ");
    REQUIRE(at != std::string::npos);
    CHECK(std::stoull(r.output.substr(at + 9)) >= 2 * ring);
  }
}

TEST_CASE("a peer killed mid all-reduce over shm is named by every survivor within a second",
          "[shm][fault]") {
  // 1 Mi floats run a plan over the rings; 16 the flat all-reduce in lines (Note [flat
  // all-reduce]); 64 Ki at n = 4 on a host of fewer cores (CI's 2) the staged one.
  for (auto [world, count] :
       {std::pair<int, std::size_t>{2, 1 << 20}, {4, 1 << 20}, {2, 16}, {4, 16}, {4, 1 << 16}}) {
    INFO("world size " << world << ", " << count << " floats");
    LaunchOptions opts;
    opts.world_size = world;
    opts.timeout_seconds = 60;
    const int victim = world - 1 == 3 ? 2 : 1;
    auto results = run_ranks(opts, [&](int rank, const std::string& tf_config, auto report) {
      auto comm = mwms::Communicator::create(mwms::resolve_tf_config(tf_config), shm_options(30));
      std::vector<float> v(count, 1.0f);
      for (int iter = 0; iter < 1000; ++iter) {
        if (rank == victim && iter == 3) ::raise(SIGKILL);
        auto start = std::chrono::steady_clock::now();
        try {
          comm->all_reduce(v.data(), v.size(), DataType::kFloat32, ReduceOp::kMean);
        } catch (const mwms::PeerError&) {
          report("detected after " + std::to_string(seconds_since(start)) + " s");
          throw;
        }
      }
    });
    INFO(mwms::testing::describe(results));
    CHECK(results[victim].signal == SIGKILL);
    for (const ChildResult& r : results) {
      if (r.rank == victim) continue;
      CHECK(r.exit_code == 1);
      CHECK_FALSE(r.timed_out);
      CHECK_THAT(r.output, Contains("rank " + std::to_string(victim)));
      auto at = r.output.find("detected after ");
      REQUIRE(at != std::string::npos);
      double seconds = std::atof(r.output.c_str() + at + 15);
      CHECK(seconds < 1.0);  // one bounded futex sleep (10 ms) plus the abort relay
    }
  }
}

TEST_CASE("a stopped peer over shm makes the others time out naming it", "[shm][fault]") {
  for (std::size_t count : {std::size_t{1} << 18, std::size_t{16}}) {  // a plan; flat
    INFO(count << " floats");
    LaunchOptions opts;
    opts.world_size = 3;
    opts.timeout_seconds = 60;
    auto results = run_ranks(opts, [count](int rank, const std::string& tf_config, auto report) {
      auto comm = mwms::Communicator::create(mwms::resolve_tf_config(tf_config), shm_options(2));
      std::vector<float> v(count, 1.0f);
      comm->all_reduce(v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum);
      if (rank == 1) {
        const pid_t me = ::getpid();
        if (::fork() == 0) {  // a reaper: the stopped rank is killed once the others are done
          ::sleep(8);
          ::kill(me, SIGKILL);
          ::_exit(0);
        }
        ::raise(SIGSTOP);
      }
      auto start = std::chrono::steady_clock::now();
      try {
        comm->all_reduce(v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum);
      } catch (const mwms::TimeoutError& e) {
        report("timed out after " + std::to_string(seconds_since(start)) + " s: " + e.what());
        throw;
      }
    });
    INFO(mwms::testing::describe(results));
    CHECK(results[1].signal == SIGKILL);
    for (int r : {0, 2}) {
      CHECK(results[r].exit_code == 1);
      CHECK_THAT(results[r].output, Contains("timed out after"));
      CHECK_THAT(results[r].output, Contains("no progress from rank 1"));
      CHECK(results[r].seconds < 7);
    }
  }
}

// Note [flat mismatch]: over shared memory small all-reduces run flat and send no frames, yet a
// rank whose call differs is still reported by every rank: another count or dtype (both flat),
// a large all-reduce (a plan beside the flat ones), a barrier beside an all-reduce.
TEST_CASE("calls that disagree over shm, flat or not, raise CollectiveMismatchError everywhere",
          "[shm][fault]") {
  // The last variant forces flat everywhere: lines (64 floats) against staged (100000), on a
  // host of any size (unforced, staged needs more ranks than cores).
  const std::pair<const char*, std::size_t> variants[] = {{"count 63", 63},
                                                          {"int32", 64},
                                                          {"count 262144", 1 << 18},
                                                          {"barrier", 0},
                                                          {"count 100000", 100000}};
  for (const auto& [named, count] : variants) {
    INFO("rank 2 differs: " << named);
    LaunchOptions opts;
    opts.world_size = 3;
    opts.timeout_seconds = 30;
    auto results = run_ranks(opts, [&](int rank, const std::string& tf_config, auto report) {
      mwms::CommunicatorOptions o = shm_options(10);
      if (count == 100000) o.algorithm = "flat";
      auto comm = mwms::Communicator::create(mwms::resolve_tf_config(tf_config), o);
      std::vector<float> v(1 << 18, 1.0f);
      try {
        comm->all_reduce(v.data(), 64, DataType::kFloat32, ReduceOp::kSum);
        if (rank != 2) {
          comm->all_reduce(v.data(), 64, DataType::kFloat32, ReduceOp::kSum);
        } else if (count == 0) {
          comm->barrier();
        } else {
          const DataType t = count == 64 ? DataType::kInt32 : DataType::kFloat32;
          comm->all_reduce(v.data(), count, t, ReduceOp::kSum);
        }
      } catch (const mwms::CollectiveMismatchError& e) {
        report(std::string("mismatch: ") + e.what());
        throw;
      }
    });
    INFO(mwms::testing::describe(results));
    for (const ChildResult& r : results) {
      CHECK(r.exit_code == 1);
      CHECK(r.seconds < 8);  // found, not timed out (10 s)
      CHECK_THAT(r.output, Contains("mismatch: "));
      CHECK_THAT(r.output, Contains(named));
    }
  }
}

TEST_CASE("stale, recycled and foreign shm addresses are refused", "[shm][fault]") {
  using mwms::collective::ShmSegment;
  const std::string job = "job-fingerprint";
  std::string stale;
  {
    auto old = ShmSegment::create(1, 2, 1 << 16, job);
    stale = old->address();
    REQUIRE(ShmSegment::open(stale, 1, 2, job) != nullptr);
  }
  // A new segment of the same shape, very likely at the same pid and fd number (recycled).
  auto fresh = ShmSegment::create(1, 2, 1 << 16, job);
  INFO("stale " << stale << ", fresh " << fresh->address());
  auto refused = [](const std::string& address, int owner, const std::string& fp) {
    try {
      ShmSegment::open(address, owner, 2, fp);
    } catch (const mwms::BootstrapError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK_THAT(refused(stale, 1, job), Contains("stale or recycled"));
  CHECK_THAT(refused(fresh->address(), 1, "another job"), Contains("another job"));
  CHECK_THAT(refused(fresh->address(), 0, job), Contains("another job"));
  CHECK_THAT(refused("12:3", 1, job), Contains("malformed"));
  CHECK_THAT(refused("1:2:3:zz", 1, job), Contains("malformed"));
  // Another file at that descriptor (stdin) and a process that is gone.
  std::string nonce = fresh->address().substr(fresh->address().rfind(':'));
  CHECK_THAT(
      refused(std::to_string(::getpid()) + ":0:" + std::to_string(fresh->size()) + nonce, 1, job),
      Contains("cannot use") || Contains("stale or recycled") || Contains("cannot open"));
  pid_t gone = ::fork();
  if (gone == 0) ::_exit(0);
  ::waitpid(gone, nullptr, 0);
  CHECK_THAT(refused(std::to_string(gone) + ":3:" + std::to_string(fresh->size()) + nonce, 1, job),
             Contains("cannot open"));
  // The real one maps, and both views share the memory.
  auto mapped = ShmSegment::open(fresh->address(), 1, 2, job);
  mapped->inbound(0).data[5] = 42;
  CHECK(fresh->inbound(0).data[5] == 42);
  mapped->reserve({0});
}

TEST_CASE("a job killed over shm leaves nothing that breaks the next one", "[shm][fault]") {
  LaunchOptions opts;
  opts.world_size = 2;
  opts.timeout_seconds = 60;
  auto killed = run_ranks(opts, [](int, const std::string& tf_config, auto) {
    auto comm = mwms::Communicator::create(mwms::resolve_tf_config(tf_config), shm_options());
    std::vector<float> v(1 << 16, 1.0f);
    comm->all_reduce(v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum);
    ::raise(SIGKILL);  // both ranks die holding their segments
  });
  for (const ChildResult& r : killed) CHECK(r.signal == SIGKILL);
  auto next = run_ranks(opts, [](int rank, const std::string& tf_config, auto) {
    auto comm = mwms::Communicator::create(mwms::resolve_tf_config(tf_config), shm_options());
    std::vector<std::int64_t> v(1000, rank + 1);
    comm->all_reduce(v.data(), v.size(), DataType::kInt64, ReduceOp::kSum);
    if (v[999] != 3) throw std::runtime_error("wrong sum " + std::to_string(v[999]));
  });
  INFO(mwms::testing::describe(next));
  for (const ChildResult& r : next) CHECK(r.exit_code == 0);
}

TEST_CASE("MWMS_SHM_DISABLE=1 moves same-host pairs to TCP", "[shm][multiproc]") {
  LaunchOptions opts;
  opts.world_size = 2;
  opts.timeout_seconds = 60;
  auto results = run_ranks(opts, [](int, const std::string& tf_config, auto report) {
    if (!mwms::testing::set_env_in_child("MWMS_SHM_DISABLE", "1", report)) return;
    mwms::CommunicatorOptions copts = shm_options();
    copts.transport = mwms::TransportChoice::kAuto;
    auto comm = mwms::Communicator::create(mwms::resolve_tf_config(tf_config), copts);
    std::vector<float> v(10, 1.0f);
    comm->all_reduce(v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum);
    if (v[0] != 2.0f) throw std::runtime_error("wrong sum");
    report(comm->describe());
    comm.reset();  // frees the listen port for the next attempt
    copts.transport = mwms::TransportChoice::kShm;
    try {
      mwms::Communicator::create(mwms::resolve_tf_config(tf_config), copts);
    } catch (const mwms::BootstrapError& e) {
      report(std::string("shm refused: ") + e.what());
    }
  });
  INFO(mwms::testing::describe(results));
  if (mwms::testing::skipped_for_cached_env(results)) return;
  for (const ChildResult& r : results) {
    CHECK(r.exit_code == 0);
    CHECK_THAT(r.output, Contains("tcp"));
    CHECK_THAT(r.output, Contains("shm refused: "));
    CHECK_THAT(r.output, Contains("MWMS_SHM_DISABLE"));
  }
}

TEST_CASE("rings larger than the host's memory fail at start-up with a clear error",
          "[shm][fault]") {
  // 4 ranks x 3 rings x 4 GiB = 48 GiB: more than half of the memory of any machine this runs
  // on, or the case is skipped (it must never really allocate that much).
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  unsigned long long kib = 0;
  std::string unit;
  unsigned long long available = 0;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") available = kib * 1024ULL;
  }
  if (available == 0 || available / 2 >= (48ULL << 30)) {
    WARN("skipped: this host has too much memory to provoke the error safely");
    return;
  }
  LaunchOptions opts;
  opts.world_size = 4;
  opts.timeout_seconds = 60;
  auto results = run_ranks(opts, [](int, const std::string& tf_config, auto report) {
    if (!mwms::testing::set_env_in_child("MWMS_SHM_RING_BYTES", "4294967296", report)) return;
    try {
      mwms::Communicator::create(mwms::resolve_tf_config(tf_config), shm_options());
      report("created");
    } catch (const mwms::Error& e) {
      report(std::string("refused: ") + e.what());
    }
  });
  INFO(mwms::testing::describe(results));
  if (mwms::testing::skipped_for_cached_env(results)) return;
  for (const ChildResult& r : results) {
    CHECK(r.exit_code == 0);
    CHECK_THAT(r.output, Contains("refused: "));
    CHECK_THAT(r.output, Contains("shared memory is too small"));
    CHECK_THAT(r.output, Contains("MWMS_SHM_DISABLE=1"));
    CHECK(r.seconds < 20);
  }
}
