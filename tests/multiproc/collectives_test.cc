// Every collective x dtype x op on 1..4 real processes, checked against a reference computed
// here: the full matrix with the selector's choices over TCP, and a reduced matrix for every
// forced all-reduce algorithm (ring, gather, rd, rhd) over each transport choice (tcp, and auto:
// shared memory on one host). Inputs are small integers so that sums and products are exact in
// every dtype (bfloat16 holds integers up to 256 exactly); float16/bfloat16 means are compared to
// one unit in the last place of the storage type, everything else for equality.
#include <catch2/catch.hpp>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "collective/transport/shm/shm_segment.h"
#include "common/env.h"
#include "kernels/reduce.h"
#include "multiproc/launcher.h"
#include "mwms/mwms.h"
#include "support/values.h"

namespace {

using mwms::testing::input_value;
using mwms::testing::store;
using mwms::testing::load;

using mwms::DataType;
using mwms::ReduceOp;

using mwms::testing::kAllDtypes;
using mwms::testing::kAllOps;

using mwms::testing::reduced_value;

// Throws (a forked rank reports it) at the first element that differs from `want`.
void expect_values(const char* what, DataType t, ReduceOp op, const void* buf, std::size_t count,
                   const std::function<double(std::size_t)>& want) {
  const std::string mismatch = mwms::testing::first_mismatch(what, t, op, buf, count, want);
  if (!mismatch.empty()) throw std::runtime_error(mismatch);
}

void check_all_reduce(mwms::Communicator& comm, DataType t, ReduceOp op, std::size_t count) {
  int n = comm.world_size();
  std::vector<char> buf(count * mwms::dtype_size(t) + 1);
  for (std::size_t i = 0; i < count; ++i) store(t, buf.data(), i, input_value(comm.rank(), i, op));
  comm.all_reduce(buf.data(), count, t, op);
  expect_values("all_reduce", t, op, buf.data(), count,
                [&](std::size_t i) { return reduced_value(n, i, t, op); });
}

void check_reduce_scatter(mwms::Communicator& comm, DataType t, ReduceOp op, std::size_t block) {
  int n = comm.world_size();
  std::size_t esize = mwms::dtype_size(t);
  std::vector<char> send(block * n * esize + 1), recv(block * esize + 1);
  for (std::size_t i = 0; i < block * n; ++i) store(t, send.data(), i, input_value(comm.rank(), i, op));
  comm.reduce_scatter(send.data(), recv.data(), block, t, op);
  std::size_t first = block * static_cast<std::size_t>(comm.rank());
  expect_values("reduce_scatter", t, op, recv.data(), block,
                [&](std::size_t i) { return reduced_value(n, first + i, t, op); });
}

void check_all_gather(mwms::Communicator& comm, DataType t, std::size_t block) {
  int n = comm.world_size();
  std::size_t esize = mwms::dtype_size(t);
  std::vector<char> send(block * esize + 1), recv(block * n * esize + 1);
  for (std::size_t i = 0; i < block; ++i) store(t, send.data(), i, input_value(comm.rank(), i, ReduceOp::kSum));
  comm.all_gather(send.data(), recv.data(), block, t);
  expect_values("all_gather", t, ReduceOp::kSum, recv.data(), block * n, [&](std::size_t i) {
    return input_value(static_cast<int>(i / block), i % block, ReduceOp::kSum);
  });
}

void check_broadcast(mwms::Communicator& comm, DataType t, std::size_t count, int root) {
  std::vector<char> buf(count * mwms::dtype_size(t) + 1);
  for (std::size_t i = 0; i < count; ++i) store(t, buf.data(), i, input_value(comm.rank(), i, ReduceOp::kSum));
  comm.broadcast(buf.data(), count, t, root);
  expect_values("broadcast", t, ReduceOp::kSum, buf.data(), count,
                [&](std::size_t i) { return input_value(root, i, ReduceOp::kSum); });
}

// The whole matrix: every collective, dtype and op, empty to several MiB.
void check_everything(mwms::Communicator& comm) {
  // empty, single, fewer than ranks, prime, and one just past the default small-message threshold
  const std::size_t counts[] = {0, 1, 7, 1009, 16411};
  for (DataType t : kAllDtypes) {
    for (ReduceOp op : kAllOps) {
      for (std::size_t count : counts) check_all_reduce(comm, t, op, count);
      check_reduce_scatter(comm, t, op, 0);
      check_reduce_scatter(comm, t, op, 1);
      check_reduce_scatter(comm, t, op, 1013);
    }
    check_all_gather(comm, t, 0);
    check_all_gather(comm, t, 1);
    check_all_gather(comm, t, 1019);
    for (int root = 0; root < comm.world_size(); ++root) check_broadcast(comm, t, 1021, root);
    comm.barrier();
  }
  // Several MiB, not divisible by the world size: exercises chunking and the pipeline.
  const std::size_t big = (3u << 20) + 1;
  check_all_reduce(comm, DataType::kFloat32, ReduceOp::kSum, big);
  check_all_reduce(comm, DataType::kBFloat16, ReduceOp::kMax, big);
  check_all_reduce(comm, DataType::kInt64, ReduceOp::kMean, big);
  check_reduce_scatter(comm, DataType::kFloat32, ReduceOp::kSum, (1u << 20) + 3);
  check_all_gather(comm, DataType::kFloat16, (1u << 20) + 3);
  check_broadcast(comm, DataType::kFloat64, (1u << 20) + 5, comm.world_size() - 1);
}

// The reduced matrix for one forced algorithm: all-reduce in three dtypes and ops that cover
// float, half and integer arithmetic, the edge counts and one message past a MiB; the other
// collectives (ring only) once, small.
void check_reduced(mwms::Communicator& comm) {
  const std::size_t counts[] = {0, 1, 3, 7, 1009, 16411};
  const DataType types[] = {DataType::kFloat32, DataType::kBFloat16, DataType::kInt64};
  const ReduceOp ops[] = {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMax, ReduceOp::kProd};
  for (DataType t : types) {
    for (ReduceOp op : ops) {
      for (std::size_t count : counts) check_all_reduce(comm, t, op, count);
    }
  }
  check_all_reduce(comm, DataType::kFloat32, ReduceOp::kSum, (1u << 20) + 1);
  check_all_reduce(comm, DataType::kFloat16, ReduceOp::kMin, (1u << 18) + 7);
  check_reduce_scatter(comm, DataType::kFloat32, ReduceOp::kSum, 1013);
  check_all_gather(comm, DataType::kInt32, 1019);
  check_broadcast(comm, DataType::kFloat64, 1021, comm.world_size() - 1);
  comm.barrier();
}

struct RunConfig {
  int world_size = 2;
  bool with_chief = false;
  std::optional<long long> small_message_bytes;  // unset: MWMS_SMALL_MESSAGE_BYTES (64 KiB)
  mwms::TransportChoice transport = mwms::TransportChoice::kTcp;
  std::string algorithm = "auto";  // CommunicatorOptions::algorithm
  bool full_matrix = true;
};

void run_everything(const RunConfig& cfg) {
  mwms::testing::LaunchOptions opts;
  opts.world_size = cfg.world_size;
  opts.with_chief = cfg.with_chief;
  opts.timeout_seconds = 240;
  auto results = mwms::testing::run_ranks(opts, [&](int, const std::string& tf_config, auto report) {
    mwms::CommunicatorOptions copts;
    copts.small_message_bytes = cfg.small_message_bytes;
    copts.transport = cfg.transport;
    copts.algorithm = cfg.algorithm;
    auto comm = mwms::Communicator::create(mwms::resolve_tf_config(tf_config), copts);
    if (cfg.full_matrix) {
      check_everything(*comm);
    } else {
      check_reduced(*comm);
    }
    report("seq " + std::to_string(comm->seq()));
  });
  INFO("world size " << cfg.world_size << ", algorithm " << cfg.algorithm << ", transport "
                     << (cfg.transport == mwms::TransportChoice::kTcp ? "tcp" : "auto"));
  INFO(mwms::testing::describe(results));
  for (const auto& r : results) {
    REQUIRE(r.exit_code == 0);
  }
}

// 2 ranks whose options differ as `differ(rank, options)` makes them, one float32 all-reduce:
// both must fail (exit 1) with an error naming `variable`.
void expect_option_mismatch(
    const std::function<void(int rank, mwms::CommunicatorOptions& options)>& differ,
    const char* variable) {
  mwms::testing::LaunchOptions opts;
  opts.world_size = 2;
  opts.timeout_seconds = 30;
  auto results = mwms::testing::run_ranks(opts, [&](int rank, const std::string& tf_config, auto) {
    mwms::CommunicatorOptions copts;
    differ(rank, copts);
    copts.timeout_seconds = 10;
    auto comm = mwms::Communicator::create(mwms::resolve_tf_config(tf_config), copts);
    std::vector<float> v(1000, 1.0f);
    comm->all_reduce(v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum);
  });
  INFO(mwms::testing::describe(results));
  for (const auto& r : results) {
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.output, Catch::Matchers::Contains(variable));
  }
}

}  // namespace

TEST_CASE("ranks with different MWMS_SMALL_MESSAGE_BYTES report a mismatch", "[tcp][fault]") {
  expect_option_mismatch(
      [](int rank, mwms::CommunicatorOptions& o) {
        o.small_message_bytes = rank == 0 ? 0 : 1 << 20;
      },
      "MWMS_SMALL_MESSAGE_BYTES");
}

TEST_CASE("ranks forcing different algorithms report a mismatch", "[tcp][fault]") {
  expect_option_mismatch(
      [](int rank, mwms::CommunicatorOptions& o) { o.algorithm = rank == 0 ? "ring" : "rhd"; },
      "MWMS_ALGO");
}

TEST_CASE("every collective dtype and op on 2 processes", "[tcp][multiproc]") {
  run_everything({2, false, -1, mwms::TransportChoice::kTcp, "auto", true});
  run_everything({2, false, 0, mwms::TransportChoice::kTcp, "auto", true});
}

TEST_CASE("every collective dtype and op on 3 processes (chief + 2 workers)", "[tcp][multiproc]") {
  run_everything({3, true, -1, mwms::TransportChoice::kTcp, "auto", true});
}

TEST_CASE("every collective dtype and op on 4 processes", "[tcp][multiproc]") {
  run_everything({4, false, -1, mwms::TransportChoice::kTcp, "auto", true});
}

TEST_CASE("every forced all-reduce algorithm over tcp and auto on 1..4 processes",
          "[tcp][multiproc]") {
  for (const char* algorithm : {"ring", "gather", "rd", "rhd"}) {
    for (mwms::TransportChoice transport :
         {mwms::TransportChoice::kTcp, mwms::TransportChoice::kAuto}) {
      for (int n = 1; n <= 4; ++n) {
        if (n == 1 && transport == mwms::TransportChoice::kAuto) continue;  // alone: no links
        run_everything({n, n == 3, -1, transport, algorithm, false});
      }
    }
  }
}

TEST_CASE("world size 1 needs no peers and keeps the values", "[tcp][unit]") {
  auto comm = mwms::Communicator::create(mwms::ResolvedCluster{});
  REQUIRE(comm->world_size() == 1);
  std::vector<float> v = {1.5f, -2.0f, 3.0f};
  comm->all_reduce(v.data(), v.size(), DataType::kFloat32, ReduceOp::kMean);
  REQUIRE(v == std::vector<float>{1.5f, -2.0f, 3.0f});
  std::vector<float> out(3);
  comm->reduce_scatter(v.data(), out.data(), 3, DataType::kFloat32, ReduceOp::kSum);
  REQUIRE(out == v);
  comm->barrier();
  REQUIRE(comm->seq() == 3);
}

TEST_CASE("steady-state collectives allocate nothing", "[tcp][multiproc]") {
  for (const char* algorithm : {"auto", "ring", "gather", "rd", "rhd"}) {
    mwms::testing::LaunchOptions opts;
    opts.world_size = 3;
    opts.timeout_seconds = 60;
    auto results =
        mwms::testing::run_ranks(opts, [&](int, const std::string& tf_config, auto report) {
          mwms::CommunicatorOptions copts;
          copts.algorithm = algorithm;
          auto comm = mwms::Communicator::create(mwms::resolve_tf_config(tf_config), copts);
          const std::size_t n = static_cast<std::size_t>(comm->world_size());
          std::vector<float> big((1u << 20) * n), small(100 * n), out(1u << 20);
          auto round = [&] {
            comm->all_reduce(big.data(), big.size(), DataType::kFloat32, ReduceOp::kMean);
            comm->all_reduce(big.data(), 50000, DataType::kFloat32, ReduceOp::kSum);
            comm->all_reduce(small.data(), 100, DataType::kFloat16, ReduceOp::kSum);
            comm->reduce_scatter(big.data(), out.data(), 1u << 20, DataType::kFloat32,
                                 ReduceOp::kSum);
            comm->all_gather(out.data(), big.data(), 1u << 20, DataType::kFloat32);
            comm->broadcast(small.data(), small.size(), DataType::kFloat32, /*root=*/1);
            comm->barrier();
          };
          mwms::testing::expect_no_allocations(round, report);
        });
    INFO("algorithm " << algorithm);
    INFO(mwms::testing::describe(results));
    for (const auto& r : results) REQUIRE(r.exit_code == 0);
  }
}

// Note [tcp stripes]: 3 streams per peer and 8 KiB stripes, so that every payload above one
// chunk is spread over all streams (and the envelope rides on stream 0 alone), with 64 KiB
// socket buffers (MWMS_SOCKET_BUFFER_BYTES): the whole matrix must come out exact, and
// steady-state collectives must still allocate nothing over TCP.
TEST_CASE("several TCP streams per peer: every collective exact, nothing allocated",
          "[tcp][multiproc]") {
  ::setenv("MWMS_NSOCKS_PERPEER", "3", 1);
  ::setenv("MWMS_CHUNK_BYTES", "8192", 1);
  // Fixed socket buffers far below a message (no autotuning): every stream fills up and drains.
  ::setenv("MWMS_SOCKET_BUFFER_BYTES", "65536", 1);
  if (mwms::common::env_int("MWMS_NSOCKS_PERPEER") != 3 ||
      mwms::common::env_int("MWMS_CHUNK_BYTES") != 8192 ||
      mwms::common::env_int("MWMS_SOCKET_BUFFER_BYTES") != 65536) {
    WARN("skipped: this test binary read the variables before; run this case alone (ctest does)");
    return;
  }
  run_everything({3, false, -1, mwms::TransportChoice::kTcp, "auto", true});
  mwms::testing::LaunchOptions opts;
  opts.world_size = 3;
  opts.timeout_seconds = 60;
  auto body = [&](int, const std::string& tf_config, auto report) {
    mwms::CommunicatorOptions copts;
    copts.transport = mwms::TransportChoice::kTcp;
    auto comm = mwms::Communicator::create(mwms::resolve_tf_config(tf_config), copts);
    report(comm->describe());
    std::vector<float> big(3u << 20), out(1u << 20);
    auto round = [&] {
      comm->all_reduce(big.data(), big.size(), DataType::kFloat32, ReduceOp::kMean);
      comm->reduce_scatter(big.data(), out.data(), 1u << 20, DataType::kFloat32, ReduceOp::kSum);
      comm->all_gather(out.data(), big.data(), 1u << 20, DataType::kFloat32);
      comm->broadcast(big.data(), 100000, DataType::kFloat32, /*root=*/2);
    };
    mwms::testing::expect_no_allocations(round, report);
  };
  auto results = mwms::testing::run_ranks(opts, body);
  INFO(mwms::testing::describe(results));
  for (const auto& r : results) {
    REQUIRE(r.exit_code == 0);
    CHECK_THAT(r.output, Catch::Matchers::Contains("links: 2 tcp (3 streams per peer)"));
  }
}

// Hidden ([.netns]): needs test hosts (tests/tools/netns_hosts.sh run 2 -- ...), run by the
// netns:hierarchical CTest test. 4 ranks on 2 hosts: ranks 0, 1 share the first.
TEST_CASE("hierarchical all-reduce across 2 test hosts x 2 ranks", "[.netns]") {
  REQUIRE(mwms::testing::test_hosts().size() == 2);
  for (mwms::TransportChoice transport :
       {mwms::TransportChoice::kAuto, mwms::TransportChoice::kTcp}) {
    run_everything({4, false, -1, transport, "hier", true});
    run_everything({4, true, -1, transport, "hier", false});  // chief + 3 workers
  }
}

// Hidden ([.netns], run by netns:hierarchical on 2 test hosts). Note [local peers before the
// exchange]: under auto a rank whose peers are all on other hosts makes no shared-memory segment;
// with 4 ranks on the 2 hosts, ranks sharing a host still make theirs and use it.
TEST_CASE("auto transport: no shm segment for a rank whose peers are all remote", "[.netns]") {
  REQUIRE(mwms::testing::test_hosts().size() == 2);
  for (int n : {2, 4}) {
    INFO("world size " << n);
    mwms::testing::LaunchOptions opts;
    opts.world_size = n;
    auto body = [&](int, const std::string& tf_config, auto report) {
      const std::uint64_t before = mwms::collective::ShmSegment::created_count();
      mwms::CommunicatorOptions copts;
      copts.transport = mwms::TransportChoice::kAuto;
      auto comm = mwms::Communicator::create(mwms::resolve_tf_config(tf_config), copts);
      std::vector<float> v(1000, 1.0f);
      comm->all_reduce(v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum);
      if (v[999] != static_cast<float>(n)) throw std::runtime_error("wrong sum");
      report("segments " + std::to_string(mwms::collective::ShmSegment::created_count() - before) +
             "; " + comm->describe());
    };
    auto results = mwms::testing::run_ranks(opts, body);
    INFO(mwms::testing::describe(results));
    for (const auto& r : results) {
      REQUIRE(r.exit_code == 0);
      CHECK_THAT(r.output, Catch::Matchers::Contains(n == 2 ? "segments 0" : "segments 1"));
    }
  }
}
