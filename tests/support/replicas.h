// What the tests of the strategy's local replicas share (unit/strategy/local_replicas_test.cc,
// device_replicas_test.cc, cuda/replicas_test.cc): a one-worker strategy of K replicas, the
// small linear model the CPU and GPU replicas train to compare bit for bit, and a run() in which
// one replica fails and its siblings must fail naming it.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "mwms/mwms.h"

namespace mwms::testing {

/// A strategy of `k` local replicas on `device` in a one-worker cluster (world size 1), with
/// `timeout_seconds` for every collective. @throws what the constructor throws (InvalidArgument
/// for k outside [1, 64], InvalidUsage/BackendError for GPU replicas without NCCL or a device).
inline MultiWorkerMirroredStrategy make_replicas(int k, ReplicaDevice device = ReplicaDevice::kCpu,
                                                 double timeout_seconds = 30) {
  CommunicationOptions options;
  options.timeout_seconds = timeout_seconds;
  ReplicaOptions replicas;
  replicas.local_replicas = k;
  replicas.device = device;
  return MultiWorkerMirroredStrategy(ResolvedCluster{}, options, replicas);
}

/// The linear model of the replica tests: kLinearIn x kLinearOut weights (row-major by input),
/// trained for kLinearSteps steps on a global batch of kLinearBatch rows, each replica on its
/// batch_shard().
constexpr int kLinearIn = 7, kLinearOut = 3, kLinearBatch = 12, kLinearSteps = 4;

/// Replica `replica`'s weight `i` before the broadcast from replica 0 (different per replica, so
/// a missing broadcast shows).
inline float linear_initial_weight(int replica, std::size_t i) {
  return 0.1f * static_cast<float>(replica + 1) * static_cast<float>(i);
}

/// Replica's local gradient at `step` for the rows of `shard` (squared error of sin inputs against
/// cos targets, divided by the global batch) into `g` (kLinearIn * kLinearOut floats, overwritten)
/// from the weights `w`. The float operations are in one fixed order, so equal weights give equal
/// bits on every replica and device.
inline void linear_gradient(const std::vector<float>& w, const Shard& shard, int step,
                            std::vector<float>& g) {
  std::fill(g.begin(), g.end(), 0.0f);
  for (std::size_t row = shard.begin; row < shard.end; ++row) {
    for (int o = 0; o < kLinearOut; ++o) {
      float pred = 0;
      for (int j = 0; j < kLinearIn; ++j)
        pred += std::sin(0.3f * (row * kLinearIn + j + step)) * w[j * kLinearOut + o];
      const float residual = (pred - std::cos(0.2f * (row + o))) / kLinearBatch;
      for (int j = 0; j < kLinearIn; ++j)
        g[j * kLinearOut + o] += residual * std::sin(0.3f * (row * kLinearIn + j + step));
    }
  }
}

/// Runs `replica_fn` on every replica of `strategy` (run()), where one replica is expected to
/// throw std::runtime_error(`root_message`) and every other to fail with the ReplicaError that
/// names it. Asserts (in the calling thread, after run() returned) that run() rethrew the root
/// error itself, not a sibling's ReplicaError, and returns the siblings' ReplicaError messages
/// in arrival order; the caller checks their number and text. Blocking until every replica ended.
inline std::vector<std::string> run_with_failing_replica(
    MultiWorkerMirroredStrategy& strategy,
    const std::function<void(const ReplicaContext&)>& replica_fn, const std::string& root_message) {
  std::mutex mu;
  std::vector<std::string> siblings;
  try {
    strategy.run([&](const ReplicaContext& ctx) {
      try {
        replica_fn(ctx);
      } catch (const ReplicaError& e) {
        std::lock_guard<std::mutex> lock(mu);
        siblings.push_back(e.what());
        throw;
      }
    });
    FAIL("run() did not rethrow");
  } catch (const ReplicaError& e) {
    FAIL("run() rethrew a sibling's ReplicaError instead of the root: " << e.what());
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()) == root_message);
  }
  return siblings;
}

}  // namespace mwms::testing
