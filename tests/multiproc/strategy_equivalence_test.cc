// The strategy's main contract (DESIGN "Strategy"): with the same global batch and seed, N workers
// end with the same weights as one worker. A linear model y = xW + b with squared loss, trained a
// few SGD steps: each worker computes sum-of-gradients / global_batch on its shard and the
// strategy all-reduces (sum) them in buckets.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <sstream>
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

// Trains on this worker's shard of each global batch and returns W followed by b. `default_op`:
// call all_reduce_gradients without an op, which must sum as TF does (the contract of strategy.h).
std::vector<float> train(mwms::MultiWorkerMirroredStrategy& strategy, bool default_op) {
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
    for (std::size_t row = shard.begin; row < shard.end; ++row) {
      for (int k = 0; k < kOut; ++k) {
        float pred = b[k];
        for (int j = 0; j < kIn; ++j) pred += feature(step, row, j) * w[j * kOut + k];
        float residual = (pred - target(step, row, k)) / kGlobalBatch;
        gb[k] += residual;
        for (int j = 0; j < kIn; ++j) gw[j * kOut + k] += residual * feature(step, row, j);
      }
    }
    if (default_op) {
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

void check_equivalence(int world_size, std::size_t bytes_per_pack, bool default_op = false) {
  mwms::CommunicationOptions options;
  options.bytes_per_pack = bytes_per_pack;
  mwms::MultiWorkerMirroredStrategy single(mwms::ResolvedCluster{}, options);
  REQUIRE(single.num_replicas_in_sync() == 1);
  std::vector<float> expected = train(single, default_op);

  mwms::testing::LaunchOptions launch;
  launch.world_size = world_size;
  launch.timeout_seconds = 60;
  auto results = mwms::testing::run_ranks(launch, [&](int, const std::string& tf, auto report) {
    mwms::MultiWorkerMirroredStrategy strategy(mwms::resolve_tf_config(tf), options);
    if (strategy.num_replicas_in_sync() != world_size) throw std::runtime_error("bad world size");
    std::ostringstream out;
    out.precision(9);
    out << "weights:";
    for (float x : train(strategy, default_op)) out << " " << x;
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

}  // namespace

TEST_CASE("2 workers end with the same weights as 1 worker", "[tcp][strategy]") {
  check_equivalence(2, 0);
}

TEST_CASE("all_reduce_gradients' default op keeps the contract (TF sums)", "[tcp][strategy]") {
  check_equivalence(2, 0, /*default_op=*/true);
}

TEST_CASE("3 workers with small buckets end with the same weights as 1 worker", "[tcp][strategy]") {
  check_equivalence(3, 64);  // several buckets, and W larger than a bucket
}

TEST_CASE("batch_shard splits a global batch into near-equal contiguous parts",
          "[unit][strategy]") {
  mwms::MultiWorkerMirroredStrategy single(mwms::ResolvedCluster{});
  mwms::Shard s = single.batch_shard(10);
  CHECK(s.begin == 0);
  CHECK(s.end == 10);
  CHECK(single.reduce(mwms::ReduceOp::kSum, 2.5) == 2.5);
}
