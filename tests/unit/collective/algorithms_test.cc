// Every algorithm's plan run by real PlanRunners over the in-memory transport, one thread per
// rank (gloo's base_test idea): world sizes 1..8, every dtype and op, counts that are empty,
// single, prime, below the world size and larger than a ring. Inputs are small integers, so every
// reduction is exact whatever the order, and each rank's result is compared byte for byte with
// one expected buffer (which also makes the ranks byte-identical to one another). kMean's
// expectation is divided by the same kernel the algorithms use.
#include "collective/algorithms/algorithms.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "collective/backend/engine_backend.h"
#include "collective/engine/flat_slots.h"
#include "collective/engine/plan_runner.h"
#include "collective/selector.h"
#include "collective/transport/mem/mem_transport.h"
#include "kernels/reduce.h"
#include "mwms/errors.h"
#include "support/threaded_world.h"
#include "support/values.h"

namespace {

using mwms::testing::input_value;
using mwms::testing::store;

using mwms::DataType;
using mwms::ReduceOp;
namespace mc = mwms::collective;

using mwms::testing::fill_expected;
using mwms::testing::fill_input;
using mwms::testing::kAllDtypes;
using mwms::testing::kAllOps;
using mwms::testing::RankState;
using mwms::testing::run_world;

const mc::Algorithm* const kAllReduceAlgorithms[] = {
    &mc::ring_all_reduce(), &mc::gather_all_reduce(), &mc::recursive_doubling_all_reduce(),
    &mc::rabenseifner_all_reduce()};

void all_reduce_matrix(RankState& st, const std::vector<std::size_t>& counts,
                       bool every_type_and_op) {
  std::vector<char> buf, want;
  for (const mc::Algorithm* algo : kAllReduceAlgorithms) {
    for (std::size_t count : counts) {
      for (DataType t : kAllDtypes) {
        for (ReduceOp op : kAllOps) {
          if (!every_type_and_op && t != DataType::kFloat32 && t != DataType::kBFloat16) continue;
          fill_input(buf, st.rank, count, t, op);
          fill_expected(want, st.world_size, 0, count, t, op);
          st.run(*algo, mc::CollectiveKind::kAllReduce, t, op, count, -1, {buf.data(), buf.data()});
          st.expect("all_reduce", *algo, t, op, count, buf.data(), want);
        }
      }
    }
  }
}

}  // namespace

TEST_CASE("every all-reduce algorithm, dtype and op on 1..8 threaded ranks", "[unit]") {
  for (int n = 1; n <= 8; ++n) {
    INFO("world size " << n);
    const std::vector<std::size_t> counts = {0, 1, 7, 1000, 65537,
                                             static_cast<std::size_t>(n - 1)};
    run_world(n, 1 << 20, 4096, [&](RankState& st) { all_reduce_matrix(st, counts, true); });
  }
}

TEST_CASE("hierarchical all-reduce on H hosts x L ranks, hosts contiguous or interleaved",
          "[unit]") {
  // {hosts, ranks per host}; ranks placed in blocks (0,1 | 2,3) or round-robin (0,2 | 1,3).
  // Every dtype and op on 2 x 2; float32 and bfloat16 (every op) on the larger shapes.
  const std::pair<int, int> shapes[] = {{2, 2}, {2, 3}, {3, 2}, {4, 2}};
  for (const auto& [num_hosts, per_host] : shapes) {
    for (bool interleaved : {false, true}) {
      const int n = num_hosts * per_host;
      std::vector<int> host_of;
      for (int r = 0; r < n; ++r) host_of.push_back(interleaved ? r % num_hosts : r / per_host);
      const mc::HostLayout layout = mc::HostLayout::from_hosts(host_of);
      REQUIRE(layout.ranks_per_host == per_host);
      INFO(num_hosts << " hosts x " << per_host << " ranks, " << (interleaved ? "interleaved" : "blocks"));
      const std::vector<std::size_t> counts = {0, 1, 7, 1000, 65537, static_cast<std::size_t>(n - 1),
                                               static_cast<std::size_t>(per_host + 1)};
      run_world(n, 1 << 16, 4096, [&](RankState& st) {
        st.hosts = &layout;
        std::vector<char> buf, want;
        const mc::Algorithm& algo = mc::hierarchical_all_reduce();
        for (std::size_t count : counts) {
          for (DataType t : kAllDtypes) {
            if (n > 4 && t != DataType::kFloat32 && t != DataType::kBFloat16) continue;
            for (ReduceOp op : kAllOps) {
              fill_input(buf, st.rank, count, t, op);
              fill_expected(want, n, 0, count, t, op);
              st.run(algo, mc::CollectiveKind::kAllReduce, t, op, count, -1,
                     {buf.data(), buf.data()});
              st.expect("all_reduce", algo, t, op, count, buf.data(), want);
            }
          }
        }
      });
    }
  }
}

TEST_CASE("the host layout numbers hosts by lowest rank and says when it is uniform", "[unit]") {
  const mc::HostLayout a = mc::HostLayout::from_hosts({7, 3, 7, 3});
  CHECK(a.num_hosts == 2);
  CHECK(a.ranks_per_host == 2);
  CHECK(a.host_of == std::vector<int>{0, 1, 0, 1});
  CHECK(a.local_index == std::vector<int>{0, 0, 1, 1});
  CHECK(a.member(0, 1) == 2);
  CHECK(a.member(1, 0) == 1);
  const mc::HostLayout b = mc::HostLayout::from_hosts({0, 0, 1});
  CHECK(b.num_hosts == 2);
  CHECK(b.ranks_per_host == 0);  // 2 + 1: not uniform
}

TEST_CASE("all-reduce algorithms through rings smaller than a message", "[unit]") {
  // 4 KiB rings: messages wrap around the ring and the sender waits for space (back-pressure).
  for (int n : {2, 3, 5, 8}) {
    INFO("world size " << n);
    run_world(n, 4096, 4096,
              [&](RankState& st) { all_reduce_matrix(st, {1, 1000, 65537}, false); });
  }
}

TEST_CASE("ring reduce-scatter, all-gather and broadcast on 2..8 threaded ranks", "[unit]") {
  for (int n = 2; n <= 8; ++n) {
    INFO("world size " << n);
    run_world(n, 1 << 16, 4096, [&](RankState& st) {
      std::vector<char> send, recv, want;
      for (std::size_t block : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1000},
                                std::size_t{20011}}) {
        const std::size_t total = block * static_cast<std::size_t>(n);
        for (DataType t : kAllDtypes) {
          const std::size_t esize = mwms::dtype_size(t);
          for (ReduceOp op : kAllOps) {
            fill_input(send, st.rank, total, t, op);
            recv.assign(block * esize + 1, 0);
            st.run(mc::ring_reduce_scatter(), mc::CollectiveKind::kReduceScatter, t, op, total,
                   -1, {send.data(), recv.data()});
            fill_expected(want, n, block * static_cast<std::size_t>(st.rank), block, t, op);
            st.expect("reduce_scatter", mc::ring_reduce_scatter(), t, op, block,
                      recv.data(), want);
          }
          // All-gather: block b of the result is rank b's input; this rank's block is in place.
          want.assign(total * esize, 0);
          for (int b = 0; b < n; ++b) {
            for (std::size_t i = 0; i < block; ++i) {
              store(t, want.data() + b * block * esize, i, input_value(b, i, ReduceOp::kSum));
            }
          }
          recv.assign(total * esize, 0);
          char* own = recv.data() + static_cast<std::size_t>(st.rank) * block * esize;
          if (block > 0) std::memcpy(own, want.data() + (own - recv.data()), block * esize);
          st.run(mc::ring_all_gather(), mc::CollectiveKind::kAllGather, t, ReduceOp::kSum, total,
                 -1, {own, recv.data()});
          st.expect("all_gather", mc::ring_all_gather(), t, ReduceOp::kSum, total,
                    recv.data(), want);
          for (int root = 0; root < n; ++root) {
            fill_input(recv, st.rank, total, t, ReduceOp::kSum);
            fill_input(want, root, total, t, ReduceOp::kSum);
            st.run(mc::ring_broadcast(), mc::CollectiveKind::kBroadcast, t, ReduceOp::kSum, total,
                   root, {recv.data(), recv.data()});
            st.expect("broadcast", mc::ring_broadcast(), t, ReduceOp::kSum, total,
                      recv.data(), want);
          }
        }
      }
    });
  }
}

TEST_CASE("forcing an algorithm that does not apply is an InvalidArgument", "[unit]") {
  mc::SelectionInput in;
  in.kind = mc::CollectiveKind::kAllReduce;
  in.topology.world_size = 4;
  mc::SelectorOptions opts;

  SECTION("an unknown name lists the choices") {
    opts.forced = "tree";
    in.bytes = 1024;
    REQUIRE_THROWS_AS(mc::select_algorithm(in, opts), mwms::InvalidArgument);
    REQUIRE_THROWS_WITH(mc::select_algorithm(in, opts),
                        Catch::Matchers::Contains("names no algorithm") &&
                            Catch::Matchers::Contains("rd") && Catch::Matchers::Contains("rhd"));
  }
  SECTION("recursive doubling beyond its size limit says why") {
    opts.forced = "rd";
    in.bytes = (std::size_t{64} << 20) + 4;
    REQUIRE_THROWS_AS(mc::select_algorithm(in, opts), mwms::InvalidArgument);
    REQUIRE_THROWS_WITH(mc::select_algorithm(in, opts),
                        Catch::Matchers::Contains("rd does not apply") &&
                            Catch::Matchers::Contains("64 MiB"));
    in.bytes = std::size_t{64} << 20;
    REQUIRE(mc::select_algorithm(in, opts).algorithm == &mc::recursive_doubling_all_reduce());
  }
  SECTION("through the engine backend, before anything is sent") {
    mc::MemFabric fabric(2, 4096);
    auto links = fabric.links_of(0);
    auto other = fabric.links_of(1);
    mc::EngineOptions eo;
    eo.selector.forced = "rd";
    eo.topology.world_size = 2;
    mc::EngineBackend engine(0, std::move(links), nullptr, eo);
    const std::size_t count = (std::size_t{64} << 20) / 4 + 1;
    std::vector<float> big(count, 1.0f);
    mc::CollectiveArgs args;
    args.call = {mc::CollectiveKind::kAllReduce, DataType::kFloat32, ReduceOp::kSum, count, -1,
                 0, 0, 2, 0};
    args.buffers = {reinterpret_cast<const char*>(big.data()),
                    reinterpret_cast<char*>(big.data())};
    REQUIRE_THROWS_AS(engine.run(args, mwms::ErrorContext{}), mwms::InvalidArgument);
  }
}

TEST_CASE("the selector takes one whole-buffer exchange for two ranks over MPI up to 2 MiB",
          "[unit]") {
  mc::SelectionInput in;
  in.kind = mc::CollectiveKind::kAllReduce;
  in.topology.world_size = 2;
  in.topology.links = mc::find_transport("mpi")->tuning;
  mc::SelectorOptions opts;
  in.bytes = std::size_t{2} << 20;
  CHECK(mc::select_algorithm(in, opts).algorithm == &mc::recursive_doubling_all_reduce());
  in.bytes = (std::size_t{2} << 20) + 4;
  CHECK(mc::select_algorithm(in, opts).algorithm == &mc::rabenseifner_all_reduce());
  in.topology.world_size = 4;  // more ranks: rd's whole-buffer steps cost log2(n) buffers
  in.bytes = std::size_t{1} << 20;
  CHECK(mc::select_algorithm(in, opts).algorithm == &mc::rabenseifner_all_reduce());
  in.topology.world_size = 2;  // not over MPI: the ring
  in.topology.links = mc::find_transport("tcp")->tuning;
  CHECK(mc::select_algorithm(in, opts).algorithm == &mc::ring_all_reduce());
}

TEST_CASE("the selector takes the hierarchical all-reduce for large messages across hosts",
          "[unit]") {
  mc::SelectorOptions opts;
  mc::SelectionInput in;
  in.topology.world_size = 4;
  in.topology.num_hosts = 2;
  in.topology.max_ranks_per_host = 2;
  in.topology.links = mc::LinkTuning{};  // shm inside the hosts, TCP between: the defaults
  in.bytes = std::size_t{16} << 20;
  CHECK(mc::select_algorithm(in, opts).algorithm == &mc::hierarchical_all_reduce());
  in.bytes = 65536 * 2;  // medium: Rabenseifner
  CHECK(mc::select_algorithm(in, opts).algorithm == &mc::rabenseifner_all_reduce());
  in.bytes = std::size_t{16} << 20;
  in.topology.uniform_hosts = false;  // 2 + 1 ranks: the flat ring
  in.topology.world_size = 3;
  CHECK(mc::select_algorithm(in, opts).algorithm == &mc::ring_all_reduce());
  opts.forced = "hier";
  REQUIRE_THROWS_WITH(mc::select_algorithm(in, opts),
                      Catch::Matchers::Contains("hier does not apply") &&
                          Catch::Matchers::Contains("same number"));
  in.topology.num_hosts = 1;  // one host
  in.topology.uniform_hosts = true;
  REQUIRE_THROWS_WITH(mc::select_algorithm(in, opts), Catch::Matchers::Contains("1 host(s)"));
}

TEST_CASE("the selector's choice is explained and the same for equal inputs", "[unit]") {
  mc::SelectorOptions opts;
  for (int n : {2, 3, 4, 5, 8, 16}) {
    for (std::size_t bytes : {std::size_t{0}, std::size_t{4}, std::size_t{4096},
                              std::size_t{65536}, std::size_t{1} << 20, std::size_t{64} << 20}) {
      for (bool shm : {false, true}) {
        mc::SelectionInput in;
        in.bytes = bytes;
        in.topology.world_size = n;
        in.topology.max_ranks_per_host = n;
        in.topology.links = mc::find_transport(shm ? "shm" : "tcp")->tuning;
        mc::Selection a = mc::select_algorithm(in, opts);
        mc::Selection b = mc::select_algorithm(in, opts);
        REQUIRE(a.algorithm != nullptr);
        REQUIRE(a.algorithm == b.algorithm);
        REQUIRE(std::strlen(a.reason) > 0);
        REQUIRE(a.algorithm->supports(in, nullptr));
      }
    }
  }
  // Collectives with one algorithm get the ring whatever is forced for all-reduce.
  mc::SelectionInput rs;
  rs.kind = mc::CollectiveKind::kReduceScatter;
  rs.topology.world_size = 4;
  opts.forced = "rhd";
  REQUIRE(mc::select_algorithm(rs, opts).algorithm == &mc::ring_reduce_scatter());
}
