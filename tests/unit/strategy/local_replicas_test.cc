// Local replicas of one worker (Note [local replicas]): K threads in one process, world size 1,
// so only the local half runs (the cross-worker half is an all-reduce over one rank). The local
// reduce combines replicas in replica order, so results are compared bit for bit with the same
// sums computed here in that order; a replica that throws, returns early, is late or passes other
// shapes makes every replica fail with an error naming it, and none hangs.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "mwms/mwms.h"
#include "support/replicas.h"

namespace {

using Catch::Matchers::Contains;
using mwms::DataType;
using mwms::ReduceOp;
using mwms::ReplicaContext;

mwms::MultiWorkerMirroredStrategy make(int k, double timeout_seconds = 30) {
  return mwms::testing::make_replicas(k, mwms::ReplicaDevice::kCpu, timeout_seconds);
}

// Not exactly representable sums: a different order of the local reduce would change bits.
float value(int replica, std::size_t i) {
  return static_cast<float>(std::sin(0.1 * static_cast<double>(i) + replica)) * (replica + 1.3f);
}

}  // namespace

TEST_CASE("local replicas: ids, shards and the local reduce in replica order", "[unit][strategy]") {
  for (int k : {1, 2, 3}) {
    INFO("K " << k);
    auto strategy = make(k);
    CHECK(strategy.num_replicas_in_sync() == k);
    CHECK(strategy.num_local_replicas() == k);
    // 1001 floats: slices of unequal size; 2 int32: fewer elements than replicas; one empty.
    std::vector<std::vector<float>> f(static_cast<std::size_t>(k), std::vector<float>(1001));
    std::vector<std::vector<std::int32_t>> n(static_cast<std::size_t>(k),
                                             std::vector<std::int32_t>(2));
    std::vector<std::vector<double>> mean(static_cast<std::size_t>(k), std::vector<double>(5));
    std::vector<ReplicaContext> seen(static_cast<std::size_t>(k));
    std::vector<std::thread::id> threads(static_cast<std::size_t>(k));
    std::vector<mwms::Shard> shards(static_cast<std::size_t>(k));
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kProd, ReduceOp::kMean}) {
      INFO("op " << mwms::to_string(op));
      strategy.run([&](const ReplicaContext& ctx) {
        const auto r = static_cast<std::size_t>(ctx.local_replica_id);
        seen[r] = ctx;
        threads[r] = std::this_thread::get_id();
        shards[r] = ctx.batch_shard(10);
        for (std::size_t i = 0; i < f[r].size(); ++i) f[r][i] = value(ctx.local_replica_id, i);
        n[r] = {ctx.local_replica_id + 2, -3};
        for (std::size_t i = 0; i < mean[r].size(); ++i) mean[r][i] = static_cast<double>(i + r);
        ctx.all_reduce(op, {{f[r].data(), f[r].size()},
                            {n[r].data(), n[r].size(), DataType::kInt32},
                            {nullptr, 0}});
        ctx.all_reduce(ReduceOp::kMean, {{mean[r].data(), mean[r].size(), DataType::kFloat64}});
      });
      for (int r = 0; r < k; ++r) {
        const auto ri = static_cast<std::size_t>(r);
        CHECK(seen[ri].local_replica_id == r);
        CHECK(seen[ri].replica_id_in_sync_group == r);
        CHECK(seen[ri].num_replicas_in_sync == k);
        CHECK(seen[ri].num_local_replicas == k);
        for (std::size_t i = 0; i < f[ri].size(); ++i) {
          float want = value(0, i);
          for (int j = 1; j < k; ++j) {
            const float x = value(j, i);
            want = op == ReduceOp::kMax    ? std::max(want, x)
                   : op == ReduceOp::kProd ? want * x
                                           : want + x;
          }
          if (op == ReduceOp::kMean) want /= static_cast<float>(k);
          if (f[ri][i] != want)
            FAIL("replica " << r << " element " << i << ": " << f[ri][i] << " != " << want);
        }
        std::int32_t want0 = 2, want1 = -3;
        for (int j = 1; j < k; ++j) {
          want0 = op == ReduceOp::kMax    ? std::max(want0, j + 2)
                  : op == ReduceOp::kProd ? want0 * (j + 2)
                                          : want0 + j + 2;
          want1 = op == ReduceOp::kMax ? -3 : op == ReduceOp::kProd ? want1 * -3 : want1 - 3;
        }
        if (op == ReduceOp::kMean) {
          want0 /= k;
          want1 /= k;
        }
        CHECK(n[ri][0] == want0);
        CHECK(n[ri][1] == want1);
        for (std::size_t i = 0; i < mean[ri].size(); ++i) {
          CHECK(mean[ri][i] == static_cast<double>(i) + (k - 1) / 2.0);
        }
      }
    }
    // K = 1 runs on the calling thread; K > 1 on K different threads, replica 0 the caller's.
    CHECK(threads[0] == std::this_thread::get_id());
    for (int r = 1; r < k; ++r) CHECK(threads[static_cast<std::size_t>(r)] != threads[0]);
    // Replica shards tile the batch in order; the worker's shard is their union.
    CHECK(shards[0].begin == 0);
    for (int r = 1; r < k; ++r) {
      CHECK(shards[static_cast<std::size_t>(r)].begin ==
            shards[static_cast<std::size_t>(r - 1)].end);
    }
    CHECK(shards[static_cast<std::size_t>(k - 1)].end == 10);
    CHECK(strategy.batch_shard(10).begin == 0);
    CHECK(strategy.batch_shard(10).end == 10);
  }
}

TEST_CASE("local replicas: broadcast_variables gives every replica replica 0's values",
          "[unit][strategy]") {
  auto strategy = make(3);
  std::vector<std::vector<float>> w(3, std::vector<float>(7));
  strategy.run([&](const ReplicaContext& ctx) {
    auto& mine = w[static_cast<std::size_t>(ctx.local_replica_id)];
    for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = 10.0f * ctx.local_replica_id + i;
    ctx.broadcast_variables({{mine.data(), mine.size()}});
  });
  for (const auto& mine : w) {
    for (std::size_t i = 0; i < mine.size(); ++i) CHECK(mine[i] == static_cast<float>(i));
  }
}

TEST_CASE("local replicas: a replica that throws fails the others at once, naming it",
          "[unit][strategy]") {
  auto strategy = make(3, /*timeout_seconds=*/60);
  const auto start = std::chrono::steady_clock::now();
  const std::vector<std::string> others = mwms::testing::run_with_failing_replica(
      strategy,
      [](const ReplicaContext& ctx) {
        std::vector<float> g(100, 1.0f);
        if (ctx.local_replica_id == 1) throw std::runtime_error("replica one's own failure");
        ctx.all_reduce(ReduceOp::kSum, {{g.data(), g.size()}});
      },
      "replica one's own failure");
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(30));  // not the deadline
  REQUIRE(others.size() == 2);
  for (const std::string& what : others) {
    CHECK_THAT(what, Contains("local replica 1 (replica_id_in_sync_group 1) of worker 0 failed") &&
                         Contains("replica one's own failure") && Contains("all_reduce"));
  }
  // The next run() starts afresh.
  std::vector<std::vector<float>> g(3, std::vector<float>(4, 2.0f));
  strategy.run([&](const ReplicaContext& ctx) {
    auto& mine = g[static_cast<std::size_t>(ctx.local_replica_id)];
    ctx.all_reduce(ReduceOp::kSum, {{mine.data(), mine.size()}});
  });
  for (const auto& mine : g) CHECK(mine[3] == 6.0f);
}

TEST_CASE("local replicas: early return, lateness and other shapes are errors naming the replica",
          "[unit][strategy]") {
  SECTION("a replica returns without the collective the others wait in") {
    auto strategy = make(2, 60);
    std::vector<float> g(8, 1.0f);
    try {
      strategy.run([&](const ReplicaContext& ctx) {
        if (ctx.local_replica_id == 0) ctx.all_reduce(ReduceOp::kSum, {{g.data(), g.size()}});
      });
      FAIL("no error");
    } catch (const mwms::InvalidUsage& e) {
      CHECK_THAT(std::string(e.what()), Contains("local replica 1") && Contains("returned"));
    }
  }
  SECTION("a replica misses the deadline") {
    auto strategy = make(2, 0.3);
    std::atomic<bool> late_got_replica_error{false};
    try {
      strategy.run([&](const ReplicaContext& ctx) {
        std::vector<float> g(8, 1.0f);
        if (ctx.local_replica_id == 1) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1200));
          try {
            ctx.all_reduce(ReduceOp::kSum, {{g.data(), g.size()}});
          } catch (const mwms::ReplicaError&) {
            late_got_replica_error = true;
          }
          return;
        }
        ctx.all_reduce(ReduceOp::kSum, {{g.data(), g.size()}});
      });
      FAIL("no error");
    } catch (const mwms::TimeoutError& e) {
      CHECK_THAT(std::string(e.what()), Contains("local replica(s) 1 of worker 0 did not reach"));
    }
    CHECK(late_got_replica_error);
  }
  SECTION("replicas pass different shapes") {
    auto strategy = make(2, 60);
    try {
      strategy.run([&](const ReplicaContext& ctx) {
        std::vector<float> g(static_cast<std::size_t>(5 + ctx.local_replica_id), 1.0f);
        ctx.all_reduce(ReduceOp::kSum, {{g.data(), g.size()}});
      });
      FAIL("no error");
    } catch (const mwms::InvalidArgument& e) {
      CHECK_THAT(std::string(e.what()), Contains("tensor 0 of local replica 1") &&
                                            Contains("count 6") && Contains("count 5"));
    }
  }
  SECTION("misuse") {
    CHECK_THROWS_AS(make(0), mwms::InvalidArgument);
    CHECK_THROWS_AS(make(65), mwms::InvalidArgument);
    ReplicaContext orphan;
    std::vector<float> g(2);
    CHECK_THROWS_AS(orphan.all_reduce(ReduceOp::kSum, {{g.data(), g.size()}}), mwms::InvalidUsage);
    for (int k : {1, 2}) {
      auto strategy = make(k, 60);
      CHECK_THROWS_AS(
          strategy.run([&](const ReplicaContext&) { strategy.run([](const ReplicaContext&) {}); }),
          mwms::InvalidUsage);
    }
  }
}

// Note [overlapped replica buckets]: each replica marks its tensors ready in its own order (and
// at its own pace), small packs make several buckets (in place, packed, one larger than a pack);
// the result must be the local reduce in replica order, bit for bit, on every replica, kMean
// dividing once.
TEST_CASE("local replicas: the overlapped step reduces each bucket in replica order, whatever "
          "the ready order", "[unit][strategy]") {
  for (int k : {1, 2, 3}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean}) {
      INFO("K " << k << " op " << mwms::to_string(op));
      mwms::CommunicationOptions options;
      options.timeout_seconds = 30;
      options.bytes_per_pack = 4096;
      mwms::ReplicaOptions replicas;
      replicas.local_replicas = k;
      mwms::MultiWorkerMirroredStrategy strategy(mwms::ResolvedCluster{}, options, replicas);
      const auto uk = static_cast<std::size_t>(k);
      // Per replica: flat (two tensors back to back), a and b (separate: packed), big (> pack).
      std::vector<std::vector<float>> flat(uk, std::vector<float>(1500)),
          a(uk, std::vector<float>(700)), b(uk, std::vector<float>(300)),
          big(uk, std::vector<float>(5000));
      const auto tensor_value = [](int r, int tensor, std::size_t i) {
        return value(r, i * 5 + static_cast<std::size_t>(tensor));
      };
      for (int step = 0; step < 3; ++step) {
        strategy.run([&](const ReplicaContext& ctx) {
          const int r = ctx.local_replica_id;
          const auto ur = static_cast<std::size_t>(r);
          for (std::size_t i = 0; i < 1500; ++i) flat[ur][i] = tensor_value(r, i < 1000 ? 0 : 1, i);
          for (std::size_t i = 0; i < 700; ++i) a[ur][i] = tensor_value(r, 2, i);
          for (std::size_t i = 0; i < 300; ++i) b[ur][i] = tensor_value(r, 3, i);
          for (std::size_t i = 0; i < 5000; ++i) big[ur][i] = tensor_value(r, 4, i);
          ctx.begin_gradient_sync({{flat[ur].data(), 1000},
                                   {flat[ur].data() + 1000, 500},
                                   {a[ur].data(), a[ur].size()},
                                   {b[ur].data(), b[ur].size()},
                                   {big[ur].data(), big[ur].size()}},
                                  op);
          // Replica- and step-dependent order and pace; tensor 4 is left to finish.
          std::vector<std::size_t> order = {3, 0, 2, 1};
          if ((r + step) % 2 == 1) order = {1, 2, 0, 3};
          for (std::size_t i : order) {
            if (r == step % k) std::this_thread::sleep_for(std::chrono::milliseconds(2));
            ctx.gradient_ready(i);
          }
          ctx.gradient_ready(order[0]);  // idempotent
          ctx.finish_gradient_sync();
        });
        for (std::size_t r = 0; r < uk; ++r) {
          const auto expect = [&](const char* what, const float* got, std::size_t n, int tensor,
                                  std::size_t offset) {
            for (std::size_t i = 0; i < n; ++i) {
              float want = tensor_value(0, tensor, offset + i);
              for (int j = 1; j < k; ++j) want += tensor_value(j, tensor, offset + i);
              if (op == ReduceOp::kMean) want /= static_cast<float>(k);
              if (got[i] != want) {
                FAIL("step " << step << " replica " << r << " " << what << "[" << i
                             << "]: " << got[i] << " != " << want);
              }
            }
          };
          expect("flat0", flat[r].data(), 1000, 0, 0);
          expect("flat1", flat[r].data() + 1000, 500, 1, 1000);
          expect("a", a[r].data(), 700, 2, 0);
          expect("b", b[r].data(), 300, 3, 0);
          expect("big", big[r].data(), 5000, 4, 0);
        }
      }
      CHECK(strategy.all_reduce_bytes() == 3 * 7500 * sizeof(float));
    }
  }
}

TEST_CASE("local replicas: a replica failing inside an overlapped step fails its siblings, and "
          "the next step works", "[unit][strategy]") {
  auto strategy = make(3, /*timeout_seconds=*/60);
  std::vector<std::vector<float>> g(3, std::vector<float>(5000, 1.0f)), h = g;
  const auto start = std::chrono::steady_clock::now();
  const std::vector<std::string> others = mwms::testing::run_with_failing_replica(
      strategy,
      [&](const ReplicaContext& ctx) {
        auto r = static_cast<std::size_t>(ctx.local_replica_id);
        ctx.begin_gradient_sync({{g[r].data(), g[r].size()}, {h[r].data(), h[r].size()}});
        ctx.gradient_ready(0);
        if (r == 2) throw std::runtime_error("replica two broke mid-backprop");
        ctx.finish_gradient_sync();
      },
      "replica two broke mid-backprop");
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(30));  // not the deadline
  REQUIRE(others.size() == 2);
  for (const std::string& what : others) {
    CHECK_THAT(what, Contains("local replica 2 (replica_id_in_sync_group 2) of worker 0 failed") &&
                         Contains("finish_gradient_sync"));
  }
  // The next overlapped step starts afresh (and the one after reuses the plan).
  for (int step = 0; step < 2; ++step) {
    strategy.run([&](const ReplicaContext& ctx) {
      auto r = static_cast<std::size_t>(ctx.local_replica_id);
      std::fill(g[r].begin(), g[r].end(), 2.0f);
      std::fill(h[r].begin(), h[r].end(), 1.0f + ctx.local_replica_id);
      ctx.begin_gradient_sync({{g[r].data(), g[r].size()}, {h[r].data(), h[r].size()}});
      ctx.finish_gradient_sync();
    });
    for (std::size_t r = 0; r < 3; ++r) {
      CHECK(g[r][4999] == 6.0f);
      CHECK(h[r][0] == 6.0f);
    }
  }
}

TEST_CASE("local replicas: overlapped step misuse is an InvalidUsage", "[unit][strategy]") {
  auto strategy = make(2, 60);
  std::vector<std::vector<float>> g(2, std::vector<float>(8, 1.0f));
  const auto mine = [&](const ReplicaContext& ctx) -> std::vector<float>& {
    return g[static_cast<std::size_t>(ctx.local_replica_id)];
  };
  SECTION("every replica returns before finish") {
    CHECK_THROWS_WITH(strategy.run([&](const ReplicaContext& ctx) {
                        ctx.begin_gradient_sync({{mine(ctx).data(), 8}});
                      }),
                      Contains("returned between ReplicaContext::begin_gradient_sync and "
                               "finish_gradient_sync"));
  }
  SECTION("another collective, a bad index, a second begin, finish without begin") {
    std::atomic<int> usage{0};
    strategy.run([&](const ReplicaContext& ctx) {
      try {
        ctx.finish_gradient_sync();
      } catch (const mwms::InvalidUsage&) {
        ++usage;
      }
      ctx.begin_gradient_sync({{mine(ctx).data(), 8}});
      try {
        ctx.all_reduce(ReduceOp::kSum, {{mine(ctx).data(), 8}});
      } catch (const mwms::InvalidUsage&) {
        ++usage;
      }
      try {
        ctx.gradient_ready(1);
      } catch (const mwms::InvalidUsage&) {
        ++usage;
      }
      try {
        ctx.begin_gradient_sync({{mine(ctx).data(), 8}});
      } catch (const mwms::InvalidUsage&) {
        ++usage;
      }
      ctx.finish_gradient_sync();
    });
    CHECK(usage == 8);
    CHECK(g[1][7] == 2.0f);
  }
  SECTION("replicas pass different ops") {
    CHECK_THROWS_WITH(strategy.run([&](const ReplicaContext& ctx) {
                        ctx.begin_gradient_sync({{mine(ctx).data(), 8}}, ctx.local_replica_id == 0
                                                                              ? ReduceOp::kSum
                                                                              : ReduceOp::kMax);
                        ctx.finish_gradient_sync();
                      }),
                      Contains("local replica 1 passed op max, local replica 0 passed sum"));
  }
  CHECK_THROWS_AS(ReplicaContext{}.gradient_ready(0), mwms::InvalidUsage);
}

TEST_CASE("local replicas: a ReplicaContext not passed by run() refuses every call, naming it",
          "[unit][strategy]") {
  const ReplicaContext ctx;
  float x[2] = {1.0f, 2.0f};
  const std::vector<mwms::TensorRef> t = {{x, 2}};
  const auto refused = [](const std::string& call) {
    return Contains(call + ": this context was not passed by MultiWorkerMirroredStrategy::run()");
  };
  CHECK_THROWS_WITH(ctx.all_reduce(ReduceOp::kSum, t), refused("ReplicaContext::all_reduce"));
  CHECK_THROWS_WITH(ctx.all_reduce(ReduceOp::kSum, t, mwms::DeviceStream{}),
                    refused("ReplicaContext::all_reduce"));
  CHECK_THROWS_WITH(ctx.broadcast_variables(t), refused("ReplicaContext::broadcast_variables"));
  CHECK_THROWS_WITH(ctx.broadcast_variables(t, mwms::DeviceStream{}),
                    refused("ReplicaContext::broadcast_variables"));
  CHECK_THROWS_WITH(ctx.begin_gradient_sync(t), refused("ReplicaContext::begin_gradient_sync"));
  CHECK_THROWS_WITH(ctx.gradient_ready(0), refused("ReplicaContext::gradient_ready"));
  CHECK_THROWS_WITH(ctx.finish_gradient_sync(), refused("ReplicaContext::finish_gradient_sync"));
  CHECK_THROWS_AS(ctx.finish_gradient_sync(), mwms::InvalidUsage);
  CHECK(x[0] == 1.0f);
  CHECK(x[1] == 2.0f);
}
