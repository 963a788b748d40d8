// The strategy's main contract (DESIGN "Strategy"): with the same global batch and seed, N workers
// end with the same weights as one worker. A linear model y = xW + b with squared loss, trained a
// few SGD steps: each worker computes sum-of-gradients / global_batch on its shard and the
// strategy all-reduces (sum) them in buckets.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <functional>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "multiproc/launcher.h"
#include "mwms/mwms.h"

namespace {

constexpr int kIn = 13, kOut = 5, kGlobalBatch = 24, kSteps = 6;

float feature(int step, int row, int j) {
  return static_cast<float>(std::sin(0.37 * (step * 131 + row * 17 + j * 3)));
}
float target(int step, int row, int k) {
  return static_cast<float>(std::cos(0.11 * (step * 7 + row * 5 + k)));
}

// How train() reduces its gradients: all_reduce_gradients with kSum; all_reduce_gradients without
// an op, which must sum as TF does (the contract of strategy.h); or overlapped, through
// begin_gradient_sync / gradient_ready / finish_gradient_sync, b's gradient declared (and marked)
// first, as backprop would finish the last layer first.
enum class Sync { kSum, kDefaultOp, kOverlap };

// Trains on this worker's shard of each global batch and returns W followed by b.
std::vector<float> train(mwms::MultiWorkerMirroredStrategy& strategy, Sync sync = Sync::kSum) {
  const bool overlap = sync == Sync::kOverlap;
  std::vector<float> w(kIn * kOut), b(kOut);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = 0.01f * static_cast<float>(i % 7);
  // Workers start from different values on purpose: the chief's must win.
  for (float& x : b) x = static_cast<float>(strategy.worker_index());
  strategy.broadcast_variables({{w.data(), w.size()}, {b.data(), b.size()}});
  std::vector<float> gw(w.size()), gb(b.size());
  mwms::Shard shard = strategy.batch_shard(kGlobalBatch);
  for (int step = 0; step < kSteps; ++step) {
    std::fill(gw.begin(), gw.end(), 0.0f);
    std::fill(gb.begin(), gb.end(), 0.0f);
    if (overlap) {
      strategy.begin_gradient_sync({{gb.data(), gb.size()}, {gw.data(), gw.size()}},
                                   mwms::ReduceOp::kSum);
    }
    for (std::size_t row = shard.begin; row < shard.end; ++row) {
      for (int k = 0; k < kOut; ++k) {
        float pred = b[k];
        for (int j = 0; j < kIn; ++j) pred += feature(step, row, j) * w[j * kOut + k];
        float residual = (pred - target(step, row, k)) / kGlobalBatch;
        gb[k] += residual;
        for (int j = 0; j < kIn; ++j) gw[j * kOut + k] += residual * feature(step, row, j);
      }
    }
    if (overlap) {
      strategy.gradient_ready(0);
      strategy.finish_gradient_sync();  // marks gw ready
    } else if (sync == Sync::kDefaultOp) {
      strategy.all_reduce_gradients({{gw.data(), gw.size()}, {gb.data(), gb.size()}});
    } else {
      strategy.all_reduce_gradients({{gw.data(), gw.size()}, {gb.data(), gb.size()}},
                                    mwms::ReduceOp::kSum);
    }
    for (std::size_t i = 0; i < w.size(); ++i) w[i] -= 0.5f * gw[i];
    for (std::size_t i = 0; i < b.size(); ++i) b[i] -= 0.5f * gb[i];
  }
  w.insert(w.end(), b.begin(), b.end());
  return w;
}

std::vector<float> parse_floats(const std::string& text) {
  std::vector<float> out;
  std::istringstream in(text.substr(text.find("weights:") + 8));
  float x;
  while (in >> x) out.push_back(x);
  return out;
}

void check_equivalence(int world_size, std::size_t bytes_per_pack, Sync sync = Sync::kSum) {
  mwms::CommunicationOptions options;
  options.bytes_per_pack = bytes_per_pack;
  std::vector<float> expected;
  {
    // Destroyed before the fork: an overlapped run leaves a progress thread, and forking a
    // multi-threaded process is what ThreadSanitizer (rightly) refuses.
    mwms::MultiWorkerMirroredStrategy single(mwms::ResolvedCluster{}, options);
    REQUIRE(single.num_replicas_in_sync() == 1);
    expected = train(single, sync);
  }

  mwms::testing::LaunchOptions launch;
  launch.world_size = world_size;
  launch.timeout_seconds = 60;
  auto results = mwms::testing::run_ranks(launch, [&](int, const std::string& tf, auto report) {
    mwms::MultiWorkerMirroredStrategy strategy(mwms::resolve_tf_config(tf), options);
    if (strategy.num_replicas_in_sync() != world_size) throw std::runtime_error("bad world size");
    std::ostringstream out;
    out.precision(9);
    out << "weights:";
    for (float x : train(strategy, sync)) out << " " << x;
    report(out.str());
  });
  INFO(mwms::testing::describe(results));
  for (const auto& r : results) {
    REQUIRE(r.exit_code == 0);
    std::vector<float> got = parse_floats(r.output);
    REQUIRE(got.size() == expected.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      INFO("rank " << r.rank << " weight " << i);
      CHECK(got[i] == Approx(expected[i]).epsilon(1e-5).margin(1e-6));
    }
  }
}

// The same model trained by K local replicas per worker (Note [local replicas]), as a TF custom
// loop would: one strategy.run per step, each replica with its own copy of W and b and its own
// gradients, its own rows of the global batch (ctx.batch_shard) and ctx.all_reduce (sum over
// workers x K). Replicas start from different values (the chief's replica 0 must win). Throws if
// the replicas of this worker do not hold bit-identical weights at the end (they apply the same
// reduced gradient to the same weights); returns replica 0's W followed by b. With `overlap`,
// each replica syncs through ctx.begin_gradient_sync / gradient_ready / finish_gradient_sync
// (Note [overlapped replica buckets]), b's gradient declared and marked first, as in train().
std::vector<float> train_replicas(mwms::MultiWorkerMirroredStrategy& strategy,
                                  bool overlap = false) {
  const auto k = static_cast<std::size_t>(strategy.num_local_replicas());
  std::vector<std::vector<float>> w(k, std::vector<float>(kIn * kOut)),
      b(k, std::vector<float>(kOut));
  std::vector<std::vector<float>> gw = w, gb = b;
  strategy.run([&](const mwms::ReplicaContext& ctx) {
    const auto r = static_cast<std::size_t>(ctx.local_replica_id);
    for (std::size_t i = 0; i < w[r].size(); ++i) w[r][i] = 0.01f * static_cast<float>(i % 7);
    // The chief's replica 0 starts as train() does (b = 0); every other replica elsewhere.
    for (float& x : b[r]) x = 1.5f * static_cast<float>(ctx.replica_id_in_sync_group);
    ctx.broadcast_variables({{w[r].data(), w[r].size()}, {b[r].data(), b[r].size()}});
  });
  for (int step = 0; step < kSteps; ++step) {
    strategy.run([&](const mwms::ReplicaContext& ctx) {
      const auto r = static_cast<std::size_t>(ctx.local_replica_id);
      std::fill(gw[r].begin(), gw[r].end(), 0.0f);
      std::fill(gb[r].begin(), gb[r].end(), 0.0f);
      if (overlap) {
        ctx.begin_gradient_sync({{gb[r].data(), gb[r].size()}, {gw[r].data(), gw[r].size()}});
      }
      const mwms::Shard shard = ctx.batch_shard(kGlobalBatch);
      for (std::size_t row = shard.begin; row < shard.end; ++row) {
        for (int k = 0; k < kOut; ++k) {
          float pred = b[r][k];
          for (int j = 0; j < kIn; ++j) pred += feature(step, row, j) * w[r][j * kOut + k];
          float residual = (pred - target(step, row, k)) / kGlobalBatch;
          gb[r][k] += residual;
          for (int j = 0; j < kIn; ++j) gw[r][j * kOut + k] += residual * feature(step, row, j);
        }
      }
      if (overlap) {
        ctx.gradient_ready(0);
        ctx.finish_gradient_sync();  // marks gw ready
      } else {
        ctx.all_reduce(mwms::ReduceOp::kSum,
                       {{gw[r].data(), gw[r].size()}, {gb[r].data(), gb[r].size()}});
      }
      for (std::size_t i = 0; i < w[r].size(); ++i) w[r][i] -= 0.5f * gw[r][i];
      for (std::size_t i = 0; i < b[r].size(); ++i) b[r][i] -= 0.5f * gb[r][i];
    });
  }
  for (std::size_t r = 1; r < k; ++r) {
    if (w[r] != w[0] || b[r] != b[0]) {
      throw std::runtime_error("local replica " + std::to_string(r) + " differs from replica 0");
    }
  }
  w[0].insert(w[0].end(), b[0].begin(), b[0].end());
  return w[0];
}

// K local replicas x `workers` workers against one replica on the same global batch. Tolerance:
// the sums of at most 24 per-row terms are grouped differently (per replica, then across
// replicas), a few float32 ulps per step over 6 steps; 1e-5 relative is ~80 ulps and far below
// any real error (a replica's rows counted twice or not at all moves weights by > 1e-2).
void check_replica_equivalence(int workers, int k, std::size_t bytes_per_pack,
                               bool overlap = false) {
  mwms::CommunicationOptions options;
  options.bytes_per_pack = bytes_per_pack;
  std::vector<float> expected;
  {
    mwms::MultiWorkerMirroredStrategy single(mwms::ResolvedCluster{}, options);
    expected = train(single);
  }
  mwms::testing::LaunchOptions launch;
  launch.world_size = workers;
  launch.timeout_seconds = 60;
  auto results = mwms::testing::run_ranks(launch, [&](int, const std::string& tf, auto report) {
    mwms::ReplicaOptions replicas;
    replicas.local_replicas = k;
    mwms::MultiWorkerMirroredStrategy strategy(mwms::resolve_tf_config(tf), options, replicas);
    if (strategy.num_replicas_in_sync() != workers * k)
      throw std::runtime_error("bad replica count");
    std::ostringstream out;
    out.precision(9);
    out << "weights:";
    for (float x : train_replicas(strategy, overlap)) out << " " << x;
    report(out.str());
  });
  INFO(workers << " worker(s) x " << k << " local replica(s)" << (overlap ? ", overlapped" : "")
               << "\n"
               << mwms::testing::describe(results));
  for (const auto& r : results) {
    REQUIRE(r.exit_code == 0);
    std::vector<float> got = parse_floats(r.output);
    REQUIRE(got.size() == expected.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      INFO("rank " << r.rank << " weight " << i);
      CHECK(got[i] == Approx(expected[i]).epsilon(1e-5).margin(1e-6));
    }
  }
}

// A 2-worker job in which every worker runs `replica_fn(rank, ctx)` once on 2 local replicas
// (strategy made with `options`); each worker reports every replica's ReplicaError ("replica R
// got ReplicaError: ...") and how run() ended ("run returned", "run threw PeerError: ...", "run
// threw: ..."), one per line.
std::vector<mwms::testing::ChildResult> run_two_workers_of_two_replicas(
    const mwms::CommunicationOptions& options,
    const std::function<void(int rank, const mwms::ReplicaContext& ctx)>& replica_fn) {
  mwms::testing::LaunchOptions launch;
  launch.world_size = 2;
  launch.timeout_seconds = 60;
  return mwms::testing::run_ranks(launch, [&](int rank, const std::string& tf, auto report) {
    mwms::ReplicaOptions replicas;
    replicas.local_replicas = 2;
    mwms::MultiWorkerMirroredStrategy strategy(mwms::resolve_tf_config(tf), options, replicas);
    std::mutex mu;
    try {
      strategy.run([&](const mwms::ReplicaContext& ctx) {
        try {
          replica_fn(rank, ctx);
        } catch (const mwms::ReplicaError& e) {
          std::lock_guard<std::mutex> lock(mu);
          report("replica " + std::to_string(ctx.local_replica_id) + " got ReplicaError: " +
                 e.what() + "\n");
          throw;
        }
      });
      report("run returned\n");
    } catch (const mwms::PeerError& e) {
      report(std::string("run threw PeerError: ") + e.what() + "\n");
    } catch (const std::runtime_error& e) {
      report(std::string("run threw: ") + e.what() + "\n");
    }
  });
}

}  // namespace

TEST_CASE("K = 1, 2, 3 local replicas x 1-3 workers end with the same weights as one replica",
          "[tcp][strategy]") {
  for (int workers : {1, 2, 3}) {
    for (int k : {1, 2, 3}) {
      // Small buckets on some: several buckets, tensors packed, W larger than a bucket.
      check_replica_equivalence(workers, k, (workers + k) % 2 == 0 ? 64 : 0);
    }
  }
}

TEST_CASE("K = 1, 2, 3 local replicas x 1-3 workers overlapping the all-reduce end with the "
          "same weights as one replica", "[tcp][strategy]") {
  for (int workers : {1, 2, 3}) {
    for (int k : {1, 2, 3}) {
      // Small buckets on some: two buckets in flight, W larger than a bucket.
      check_replica_equivalence(workers, k, (workers + k) % 2 == 0 ? 64 : 0, /*overlap=*/true);
    }
  }
}

TEST_CASE("workers with different local replica counts fail at construction, naming them",
          "[tcp][strategy]") {
  mwms::testing::LaunchOptions launch;
  launch.world_size = 2;
  launch.timeout_seconds = 60;
  auto results =
      mwms::testing::run_ranks(launch, [&](int rank, const std::string& tf, auto report) {
        mwms::ReplicaOptions replicas;
        replicas.local_replicas = rank + 1;
        try {
          mwms::MultiWorkerMirroredStrategy strategy(mwms::resolve_tf_config(tf), {}, replicas);
        } catch (const mwms::InvalidArgument& e) {
          report(e.what());
        }
      });
  INFO(mwms::testing::describe(results));
  REQUIRE(results.size() == 2);
  CHECK_THAT(results[0].output, Catch::Matchers::Contains("worker 0 has 1, worker 1 has 2"));
  CHECK_THAT(results[1].output, Catch::Matchers::Contains("worker 1 has 2, worker 0 has 1"));
}

TEST_CASE("a local replica that throws on one worker fails every replica of every worker",
          "[tcp][strategy][fault]") {
  // Worker 1's replica 1 throws before the all-reduce: worker 1's replica 0 stops waiting for it
  // (ReplicaError) and run() rethrows the root; worker 1 exits, so worker 0's replica 0 gets a
  // PeerError from the cross-worker all-reduce and its replica 1 a ReplicaError naming replica 0.
  mwms::CommunicationOptions options;
  options.timeout_seconds = 30;
  std::vector<std::vector<float>> g(2, std::vector<float>(1000, 1.0f));
  auto results = run_two_workers_of_two_replicas(options, [&](int rank,
                                                              const mwms::ReplicaContext& ctx) {
    if (rank == 1 && ctx.local_replica_id == 1) {
      throw std::runtime_error("worker 1 replica 1 broke");
    }
    auto& mine = g[static_cast<std::size_t>(ctx.local_replica_id)];
    ctx.all_reduce(mwms::ReduceOp::kSum, {{mine.data(), mine.size()}});
  });
  INFO(mwms::testing::describe(results));
  REQUIRE(results.size() == 2);
  using Catch::Matchers::Contains;
  CHECK_THAT(results[1].output, Contains("run threw: worker 1 replica 1 broke") &&
                                    Contains("replica 0 got ReplicaError: local replica 1"));
  CHECK_THAT(results[0].output, Contains("run threw PeerError") && Contains("rank 1") &&
                                    Contains("replica 1 got ReplicaError: local replica 0"));
  for (const auto& r : results) CHECK(r.seconds < 25);  // failed at once, not at the deadline
}

TEST_CASE("a local replica that throws inside an overlapped step fails every replica of every "
          "worker", "[tcp][strategy][fault]") {
  // Worker 1's replica 1 throws after begin_gradient_sync: worker 1's buckets never complete
  // locally, its replica 0 stops waiting in finish (ReplicaError) and run() rethrows the root;
  // worker 0's buckets started, so its replica 0 gets a PeerError when worker 1 exits and its
  // replica 1 a ReplicaError naming replica 0. All at once, not at the 30 s deadline.
  mwms::CommunicationOptions options;
  options.timeout_seconds = 30;
  options.bytes_per_pack = 1024;  // several buckets
  std::vector<std::vector<float>> g(2, std::vector<float>(1000, 1.0f)), h = g;
  auto results = run_two_workers_of_two_replicas(options, [&](int rank,
                                                              const mwms::ReplicaContext& ctx) {
    const auto r = static_cast<std::size_t>(ctx.local_replica_id);
    ctx.begin_gradient_sync({{g[r].data(), g[r].size()}, {h[r].data(), h[r].size()}});
    if (rank == 1 && r == 1) throw std::runtime_error("worker 1 replica 1 broke");
    ctx.gradient_ready(1);
    ctx.finish_gradient_sync();
  });
  INFO(mwms::testing::describe(results));
  REQUIRE(results.size() == 2);
  using Catch::Matchers::Contains;
  CHECK_THAT(results[1].output, Contains("run threw: worker 1 replica 1 broke") &&
                                    Contains("replica 0 got ReplicaError: local replica 1") &&
                                    Contains("finish_gradient_sync"));
  CHECK_THAT(results[0].output, Contains("run threw PeerError") && Contains("rank 1") &&
                                    Contains("replica 1 got ReplicaError: local replica 0"));
  for (const auto& r : results) CHECK(r.seconds < 25);  // failed at once, not at the deadline
}

TEST_CASE("2 workers end with the same weights as 1 worker", "[tcp][strategy]") {
  check_equivalence(2, 0);
}

TEST_CASE("3 workers with small buckets end with the same weights as 1 worker", "[tcp][strategy]") {
  check_equivalence(3, 64);  // several buckets, and W larger than a bucket
}

TEST_CASE("2 and 3 workers overlapping the all-reduce end with the same weights as 1 worker",
          "[tcp][strategy]") {
  check_equivalence(2, 0, Sync::kOverlap);
  check_equivalence(3, 64, Sync::kOverlap);  // several buckets in flight
}

TEST_CASE("all_reduce_gradients' default op keeps the contract (TF sums)", "[tcp][strategy]") {
  check_equivalence(2, 0, Sync::kDefaultOp);
}

TEST_CASE("batch_shard splits a global batch into near-equal contiguous parts", "[unit][strategy]") {
  mwms::MultiWorkerMirroredStrategy single(mwms::ResolvedCluster{});
  mwms::Shard s = single.batch_shard(10);
  CHECK(s.begin == 0);
  CHECK(s.end == 10);
  CHECK(single.reduce(mwms::ReduceOp::kSum, 2.5) == 2.5);
}

TEST_CASE("overlapped gradient sync gives the blocking result whatever the ready order",
          "[tcp][strategy]") {
  // Tensors: two back to back in one array (a contiguous bucket), two in separate arrays (packed),
  // one larger than a pack (alone, in place); small packs, so several buckets are in flight.
  // Each rank marks them ready in its own order: buckets still start in list order on every rank.
  for (int n : {2, 3}) {
    mwms::testing::LaunchOptions launch;
    launch.world_size = n;
    launch.timeout_seconds = 120;
    auto results = mwms::testing::run_ranks(launch, [&](int rank, const std::string& tf, auto report) {
      mwms::CommunicationOptions options;
      options.bytes_per_pack = 4096;
      options.timeout_seconds = 60;
      mwms::MultiWorkerMirroredStrategy strategy(mwms::resolve_tf_config(tf), options);
      std::vector<float> flat(1500), a(700), b(300), big(5000);
      auto value = [&](int r, std::size_t tensor, std::size_t i) {
        return static_cast<float>((r + 1) * 3 + static_cast<int>(tensor * 7 + i % 13));
      };
      for (int step = 0; step < 3; ++step) {
        for (std::size_t i = 0; i < 1000; ++i) flat[i] = value(rank, 0, i);
        for (std::size_t i = 0; i < 500; ++i) flat[1000 + i] = value(rank, 1, i);
        for (std::size_t i = 0; i < a.size(); ++i) a[i] = value(rank, 2, i);
        for (std::size_t i = 0; i < b.size(); ++i) b[i] = value(rank, 3, i);
        for (std::size_t i = 0; i < big.size(); ++i) big[i] = value(rank, 4, i);
        std::vector<mwms::TensorRef> grads = {
            {flat.data(), 1000, mwms::DataType::kFloat32}, {flat.data() + 1000, 500, mwms::DataType::kFloat32},
            {a.data(), a.size(), mwms::DataType::kFloat32}, {b.data(), b.size(), mwms::DataType::kFloat32},
            {big.data(), big.size(), mwms::DataType::kFloat32}};
        strategy.begin_gradient_sync(grads, mwms::ReduceOp::kSum);
        // rank-dependent ready order; the last tensor is left to finish_gradient_sync
        const std::vector<std::size_t> order =
            rank % 2 == 0 ? std::vector<std::size_t>{3, 0, 2, 1} : std::vector<std::size_t>{1, 2, 0, 3};
        for (std::size_t i : order) strategy.gradient_ready(i);
        strategy.gradient_ready(order[0]);  // idempotent
        strategy.finish_gradient_sync();
        auto expect = [&](const char* what, const float* got, std::size_t count, std::size_t tensor) {
          for (std::size_t i = 0; i < count; ++i) {
            float want = 0;
            for (int r = 0; r < n; ++r) want += value(r, tensor, i);
            if (got[i] != want) {
              throw std::runtime_error(std::string(what) + " element " + std::to_string(i) + " is " +
                                       std::to_string(got[i]) + ", expected " + std::to_string(want));
            }
          }
        };
        expect("flat[0]", flat.data(), 1000, 0);
        expect("flat[1]", flat.data() + 1000, 500, 1);
        expect("a", a.data(), a.size(), 2);
        expect("b", b.data(), b.size(), 3);
        expect("big", big.data(), big.size(), 4);
      }
      // Misuse is an InvalidUsage, and the strategy still works afterwards.
      bool threw = false;
      try {
        strategy.finish_gradient_sync();
      } catch (const mwms::InvalidUsage&) {
        threw = true;
      }
      std::vector<float> one(10, 1.0f);
      strategy.begin_gradient_sync({{one.data(), one.size(), mwms::DataType::kFloat32}});
      try {
        strategy.gradient_ready(1);
        threw = false;
      } catch (const mwms::InvalidUsage&) {
      }
      strategy.finish_gradient_sync();
      if (!threw || one[0] != static_cast<float>(n)) throw std::runtime_error("misuse not reported");
      report("exposed " + std::to_string(strategy.exposed_all_reduce_seconds()));
    });
    INFO("world size " << n << "\n" << mwms::testing::describe(results));
    for (const auto& r : results) REQUIRE(r.exit_code == 0);
  }
}

TEST_CASE("fp16 and bf16 gradient compression sum exactly what the 16-bit types can hold, and "
          "round the rest as the 16-bit sum does", "[tcp][strategy]") {
  for (mwms::Compression c : {mwms::Compression::kFloat16, mwms::Compression::kBFloat16}) {
    mwms::testing::LaunchOptions launch;
    launch.world_size = 3;
    launch.timeout_seconds = 60;
    auto results = mwms::testing::run_ranks(launch, [&](int rank, const std::string& tf, auto) {
      mwms::CommunicationOptions options;
      options.compression = c;
      options.bytes_per_pack = 4096;  // several buckets
      mwms::MultiWorkerMirroredStrategy strategy(mwms::resolve_tf_config(tf), options);
      for (bool overlap : {false, true}) {
        // Multiples of 1/4 up to 64: exact in float16 and bfloat16, and so are their sums.
        std::vector<float> a(3000), b(50);
        std::vector<double> ints(7, rank + 0.1);  // float64: never compressed
        for (std::size_t i = 0; i < a.size(); ++i) a[i] = 0.25f * static_cast<float>((i + rank) % 64);
        for (std::size_t i = 0; i < b.size(); ++i) b[i] = -1.0f * static_cast<float>(rank);
        // 1 + 2^-12: float16 rounds it to 1, bfloat16 too, float32 keeps it.
        a[0] = 1.0f + std::ldexp(1.0f, -12);
        std::vector<mwms::TensorRef> grads = {{a.data(), a.size()}, {b.data(), b.size()},
                                              {ints.data(), ints.size(), mwms::DataType::kFloat64}};
        if (overlap) {
          strategy.begin_gradient_sync(grads);
          strategy.finish_gradient_sync();
        } else {
          strategy.all_reduce_gradients(grads);
        }
        if (a[0] != 3.0f) throw std::runtime_error("a[0] = " + std::to_string(a[0]) + ", expected 3 (rounded)");
        for (std::size_t i = 1; i < a.size(); ++i) {
          float want = 0;
          for (int r = 0; r < 3; ++r) want += 0.25f * static_cast<float>((i + r) % 64);
          if (a[i] != want) throw std::runtime_error("a[" + std::to_string(i) + "] wrong");
        }
        for (float v : b) if (v != -3.0f) throw std::runtime_error("b wrong");
        for (double v : ints) {
          if (std::fabs(v - 3.3) > 1e-12) throw std::runtime_error("float64 tensor was compressed");
        }
      }
    });
    INFO(mwms::testing::describe(results));
    for (const auto& r : results) REQUIRE(r.exit_code == 0);
  }
}

// Note [solo tensors]: gradients of 256 KiB and more are all-reduced alone, in place, the others
// packed; both kinds, blocking and overlapped, on 2 and 3 workers, must give the exact sums.
TEST_CASE("solo and packed gradients give the exact sums, blocking and overlapped",
          "[tcp][strategy]") {
  for (int world : {2, 3}) {
    mwms::testing::LaunchOptions launch;
    launch.world_size = world;
    launch.timeout_seconds = 60;
    auto results = mwms::testing::run_ranks(launch, [&](int rank, const std::string& tf, auto report) {
      mwms::CommunicationOptions options;
      options.bytes_per_pack = 1 << 20;
      mwms::MultiWorkerMirroredStrategy strategy(mwms::resolve_tf_config(tf), options);
      // 1 KiB, 300 KiB (solo), 3 KiB, 1.5 MiB (solo, larger than a pack), 5 KiB: separate
      // allocations, so nothing is adjacent.
      const std::vector<std::size_t> sizes{256, 75 * 1024, 768, 384 * 1024, 1280};
      std::vector<std::vector<float>> grads(sizes.size());
      const auto fill = [&] {
        for (std::size_t t = 0; t < sizes.size(); ++t) {
          grads[t].resize(sizes[t]);
          for (std::size_t i = 0; i < sizes[t]; ++i)
            grads[t][i] = static_cast<float>((rank + 1) * (i % 97) + t);
        }
      };
      const auto check = [&](const char* path) {
        const int sum_ranks = world * (world + 1) / 2;
        for (std::size_t t = 0; t < sizes.size(); ++t) {
          for (std::size_t i = 0; i < sizes[t]; ++i) {
            const float want = static_cast<float>(sum_ranks * (i % 97) + world * t);
            if (grads[t][i] != want) {
              throw std::runtime_error(std::string(path) + ": tensor " + std::to_string(t) +
                                       " element " + std::to_string(i) + " is " +
                                       std::to_string(grads[t][i]) + ", want " +
                                       std::to_string(want));
            }
          }
        }
      };
      std::vector<mwms::TensorRef> refs;
      fill();
      for (auto& g : grads) refs.push_back({g.data(), g.size()});
      strategy.all_reduce_gradients(refs);
      check("blocking");
      fill();
      strategy.begin_gradient_sync(refs);
      for (std::size_t t = sizes.size(); t-- > 0;) strategy.gradient_ready(t);  // backprop order
      strategy.finish_gradient_sync();
      check("overlapped");
      report("ok");
    });
    INFO(mwms::testing::describe(results));
    REQUIRE(results.size() == static_cast<std::size_t>(world));
    for (const auto& r : results) {
      CHECK(r.exit_code == 0);
      CHECK_THAT(r.output, Catch::Matchers::Contains("ok"));
    }
  }
}
