// What the tests of the strategy's local replicas share (unit/strategy/local_replicas_test.cc,
// device_replicas_test.cc, cuda/replicas_test.cc, multiproc/gpu_replicas_test.cc): a one-worker
// strategy of K replicas, the small linear model the CPU and GPU replicas train to compare bit
// for bit (and its training loop, with a seam for real device memory: ReplicaDeviceMemory), and a
// run() in which one replica fails and its siblings must fail naming it.
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

/// Real device memory for train_replica_model's device collectives (cuda/replicas_test.cc
/// implements it with the CUDA runtime; the fake NCCL needs none: its "device" memory is host
/// memory). Each local replica has two device buffers of kLinearIn * kLinearOut floats on its
/// own device (ReplicaContext::device), slot 0 for the weights and slot 1 for the gradient, and
/// one stream that orders its copies and collectives. Every method is called on the replica's
/// own thread, inside run(), and touches only that replica's buffers (no locking needed between
/// replicas).
class ReplicaDeviceMemory {
 public:
  virtual ~ReplicaDeviceMemory() = default;
  /// Enqueues on stream(ctx) the copy of the `n` floats at `host` into replica
  /// ctx.local_replica_id's device buffer `slot` (made on first use, `n` the same on every call)
  /// and returns that buffer; `host` may be reused once this returns. @throws on a device error.
  virtual float* to_device(const ReplicaContext& ctx, int slot, const float* host,
                           std::size_t n) = 0;
  /// Copies that device buffer back into the `n` floats at `host` after everything enqueued on
  /// stream(ctx), blocking until the copy is done. @throws on a device error.
  virtual void to_host(const ReplicaContext& ctx, int slot, float* host, std::size_t n) = 0;
  /// The stream (a cudaStream_t of the replica's device) the replica's device collectives use.
  virtual DeviceStream stream(const ReplicaContext& ctx) = 0;
};

/// Trains the linear model for kLinearSteps SGD steps: every replica on its rows of each global
/// batch (ReplicaContext::batch_shard), gradients summed over all replicas in sync, weights from
/// the broadcast of the chief's replica 0 (each replica in sync starts from
/// linear_initial_weight of its replica_id_in_sync_group, so a missing broadcast shows). `device`
/// selects the replicas' device collectives: with `memory` null (the fake NCCL) the device
/// buffers are these host vectors on the default stream; with `memory` the weights and gradient
/// go to its device buffers before each collective and come back after it, on its stream
/// (gradient and update are computed on the host either way, so the CPU and device runs compute
/// the same float operations). Blocking, collective across the workers: one worker
/// (unit/strategy/device_replicas_test.cc, cuda/replicas_test.cc) or W worker processes
/// (multiproc/gpu_replicas_test.cc). Returns every local replica's final weights (kLinearIn *
/// kLinearOut floats each). @throws as strategy.run and `memory`'s methods.
inline std::vector<std::vector<float>> train_replica_model(MultiWorkerMirroredStrategy& strategy,
                                                           bool device,
                                                           ReplicaDeviceMemory* memory = nullptr) {
  const auto k = static_cast<std::size_t>(strategy.num_local_replicas());
  const std::size_t n = kLinearIn * kLinearOut;
  std::vector<std::vector<float>> w(k, std::vector<float>(n)), g = w;
  // The device collective `collective` on `slot`'s host vector `host` (in place).
  auto on_device = [&](const ReplicaContext& ctx, int slot, std::vector<float>& host,
                       const auto& collective) {
    if (memory == nullptr) {
      collective(TensorRef{host.data(), n}, DeviceStream{});
      return;
    }
    collective(TensorRef{memory->to_device(ctx, slot, host.data(), n), n}, memory->stream(ctx));
    memory->to_host(ctx, slot, host.data(), n);
  };
  strategy.run([&](const ReplicaContext& ctx) {
    auto& mine = w[static_cast<std::size_t>(ctx.local_replica_id)];
    for (std::size_t i = 0; i < mine.size(); ++i)
      mine[i] = linear_initial_weight(ctx.replica_id_in_sync_group, i);
    if (device) {
      on_device(ctx, 0, mine,
                [&](TensorRef t, DeviceStream s) { ctx.broadcast_variables({t}, s); });
    } else {
      ctx.broadcast_variables({{mine.data(), mine.size()}});
    }
  });
  for (int step = 0; step < kLinearSteps; ++step) {
    strategy.run([&](const ReplicaContext& ctx) {
      const auto r = static_cast<std::size_t>(ctx.local_replica_id);
      linear_gradient(w[r], ctx.batch_shard(kLinearBatch), step, g[r]);
      if (device) {
        on_device(ctx, 1, g[r],
                  [&](TensorRef t, DeviceStream s) { ctx.all_reduce(ReduceOp::kSum, {t}, s); });
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
