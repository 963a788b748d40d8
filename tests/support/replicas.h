// What the tests of the strategy's local replicas share (unit/strategy/local_replicas_test.cc,
// device_replicas_test.cc, cuda/replicas_test.cc, multiproc/gpu_replicas_test.cc): a one-worker
// strategy of K replicas, the small linear model the CPU and GPU replicas train to compare bit
// for bit (and its training loop), and a run() in which one replica fails and its siblings must
// fail naming it.
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

/// Trains the linear model for kLinearSteps SGD steps: every replica on its rows of each global
/// batch (ReplicaContext::batch_shard), gradients summed over all replicas in sync, weights from
/// the broadcast of the chief's replica 0 (each replica in sync starts from
/// linear_initial_weight of its replica_id_in_sync_group, so a missing broadcast shows). `device`
/// selects the replicas' device collectives (DeviceStream; over the fake NCCL "device" memory is
/// these host vectors). Blocking, collective across the workers: one worker
/// (unit/strategy/device_replicas_test.cc) or W worker processes (multiproc/gpu_replicas_test.cc).
/// Returns every local replica's final weights (kLinearIn * kLinearOut floats each).
/// @throws as strategy.run.
inline std::vector<std::vector<float>> train_replica_model(MultiWorkerMirroredStrategy& strategy,
                                                           bool device) {
  const auto k = static_cast<std::size_t>(strategy.num_local_replicas());
  std::vector<std::vector<float>> w(k, std::vector<float>(kLinearIn * kLinearOut)), g = w;
  strategy.run([&](const ReplicaContext& ctx) {
    auto& mine = w[static_cast<std::size_t>(ctx.local_replica_id)];
    for (std::size_t i = 0; i < mine.size(); ++i)
      mine[i] = linear_initial_weight(ctx.replica_id_in_sync_group, i);
    if (device) {
      ctx.broadcast_variables({{mine.data(), mine.size()}}, DeviceStream{});
    } else {
      ctx.broadcast_variables({{mine.data(), mine.size()}});
    }
  });
  for (int step = 0; step < kLinearSteps; ++step) {
    strategy.run([&](const ReplicaContext& ctx) {
      const auto r = static_cast<std::size_t>(ctx.local_replica_id);
      linear_gradient(w[r], ctx.batch_shard(kLinearBatch), step, g[r]);
      if (device) {
        ctx.all_reduce(ReduceOp::kSum, {{g[r].data(), g[r].size()}}, DeviceStream{});
      } else {
        ctx.all_reduce(ReduceOp::kSum, {{g[r].data(), g[r].size()}});
      }
      for (std::size_t i = 0; i < w[r].size(); ++i) w[r][i] -= 0.5f * g[r][i];
    });
  }
  return w;
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
