// A small linear model trained by a strategy's local replicas (Note [local replicas]) through
// their host or their device collectives, for the GPU-replica tests over the fake NCCL: one
// worker (unit/strategy/device_replicas_test.cc) and W worker processes
// (multiproc/gpu_replicas_test.cc).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "mwms/mwms.h"

namespace mwms::testing {

namespace replica_model {
constexpr int kIn = 7, kOut = 3, kGlobalBatch = 12, kSteps = 4;
}  // namespace replica_model

/// Trains a kIn x kOut linear model kSteps SGD steps: every replica on its rows of each global
/// batch of kGlobalBatch (ReplicaContext::batch_shard), gradients summed over all replicas in
/// sync. Replica i in sync starts from 0.1 (i + 1) x index (the chief's replica 0 wins the
/// broadcast). `device` selects the replicas' device collectives (DeviceStream; over the fake
/// NCCL "device" memory is these host vectors). Blocking, collective across the workers. Returns
/// every local replica's final weights (kIn·kOut floats each). @throws as strategy.run.
inline std::vector<std::vector<float>> train_replica_model(MultiWorkerMirroredStrategy& strategy,
                                                           bool device) {
  using namespace replica_model;
  const auto k = static_cast<std::size_t>(strategy.num_local_replicas());
  std::vector<std::vector<float>> w(k, std::vector<float>(kIn * kOut)), g = w;
  strategy.run([&](const ReplicaContext& ctx) {
    auto& mine = w[static_cast<std::size_t>(ctx.local_replica_id)];
    for (std::size_t i = 0; i < mine.size(); ++i)
      mine[i] = 0.1f * (ctx.replica_id_in_sync_group + 1) * i;
    if (device) {
      ctx.broadcast_variables({{mine.data(), mine.size()}}, DeviceStream{});
    } else {
      ctx.broadcast_variables({{mine.data(), mine.size()}});
    }
  });
  for (int step = 0; step < kSteps; ++step) {
    strategy.run([&](const ReplicaContext& ctx) {
      const auto r = static_cast<std::size_t>(ctx.local_replica_id);
      std::fill(g[r].begin(), g[r].end(), 0.0f);
      const Shard shard = ctx.batch_shard(kGlobalBatch);
      for (std::size_t row = shard.begin; row < shard.end; ++row) {
        for (int o = 0; o < kOut; ++o) {
          float pred = 0;
          for (int j = 0; j < kIn; ++j)
            pred += std::sin(0.3f * (row * kIn + j + step)) * w[r][j * kOut + o];
          const float residual = (pred - std::cos(0.2f * (row + o))) / kGlobalBatch;
          for (int j = 0; j < kIn; ++j)
            g[r][j * kOut + o] += residual * std::sin(0.3f * (row * kIn + j + step));
        }
      }
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

}  // namespace mwms::testing
