// gpu:replicas — the strategy's GPU replicas (ReplicaOptions::device = kGpu, Note [gpu replicas])
// over the real NCCL and CUDA runtime: K = 1 GPU replica (one NCCL rank, made through the grouped
// init from our unique id) trains the small linear model of unit:GPU replicas with its gradient
// all-reduced in device memory on its own stream, and must end bit for bit where one CPU replica
// ends; kMean divides on the device; with 2 or more GPUs, K = 2 GPU replicas against 2 CPU
// replicas as well. Skipped (exit 77, gpu_main.cc) without a device.
#include <cuda_runtime.h>

#include <catch2/catch.hpp>

#include <vector>

#include "kernels/cuda/cuda_kernels.h"
#include "mwms/mwms.h"
#include "support/replicas.h"

namespace {

namespace cu = mwms::kernels::cuda;
using mwms::ReduceOp;
using mwms::ReplicaContext;

using mwms::testing::kLinearIn;
using mwms::testing::kLinearOut;
using mwms::testing::kLinearSteps;

mwms::MultiWorkerMirroredStrategy make(int k, mwms::ReplicaDevice device) {
  return mwms::testing::make_replicas(k, device, /*timeout_seconds=*/60);
}

// Per replica: host weights and gradient; on kGpu the gradient and the weights also live on the
// replica's device (its own stream) and go through the device collectives.
std::vector<std::vector<float>> train(mwms::MultiWorkerMirroredStrategy& strategy, bool gpu) {
  const auto k = static_cast<std::size_t>(strategy.num_local_replicas());
  const std::size_t n = kLinearIn * kLinearOut;
  std::vector<std::vector<float>> w(k, std::vector<float>(n)), g = w;
  std::vector<float*> dw(k, nullptr), dg(k, nullptr);
  std::vector<cudaStream_t> streams(k, nullptr);
  if (gpu) {
    strategy.run([&](const ReplicaContext& ctx) {
      const auto r = static_cast<std::size_t>(ctx.local_replica_id);
      cu::check(cudaSetDevice(ctx.device), "cudaSetDevice");
      cu::check(cudaStreamCreate(&streams[r]), "cudaStreamCreate");
      cu::check(cudaMalloc(reinterpret_cast<void**>(&dw[r]), n * sizeof(float)), "cudaMalloc");
      cu::check(cudaMalloc(reinterpret_cast<void**>(&dg[r]), n * sizeof(float)), "cudaMalloc");
    });
  }
  strategy.run([&](const ReplicaContext& ctx) {
    const auto r = static_cast<std::size_t>(ctx.local_replica_id);
    for (std::size_t i = 0; i < n; ++i)
      w[r][i] = mwms::testing::linear_initial_weight(ctx.local_replica_id, i);
    if (!gpu) {
      ctx.broadcast_variables({{w[r].data(), n}});
      return;
    }
    cu::check(cudaSetDevice(ctx.device), "cudaSetDevice");
    cu::check(cudaMemcpyAsync(dw[r], w[r].data(), n * sizeof(float), cudaMemcpyHostToDevice,
                              streams[r]),
              "cudaMemcpyAsync");
    ctx.broadcast_variables({{dw[r], n}}, mwms::DeviceStream{streams[r]});
    cu::check(cudaMemcpy(w[r].data(), dw[r], n * sizeof(float), cudaMemcpyDeviceToHost),
              "cudaMemcpy");
  });
  for (int step = 0; step < kLinearSteps; ++step) {
    strategy.run([&](const ReplicaContext& ctx) {
      const auto r = static_cast<std::size_t>(ctx.local_replica_id);
      mwms::testing::linear_gradient(w[r], ctx.batch_shard(mwms::testing::kLinearBatch), step,
                                     g[r]);
      if (gpu) {
        cu::check(cudaSetDevice(ctx.device), "cudaSetDevice");
        cu::check(cudaMemcpyAsync(dg[r], g[r].data(), n * sizeof(float), cudaMemcpyHostToDevice,
                                  streams[r]),
                  "cudaMemcpyAsync");
        ctx.all_reduce(ReduceOp::kSum, {{dg[r], n}}, mwms::DeviceStream{streams[r]});
        cu::check(cudaMemcpyAsync(g[r].data(), dg[r], n * sizeof(float), cudaMemcpyDeviceToHost,
                                  streams[r]),
                  "cudaMemcpyAsync");
        cu::check(cudaStreamSynchronize(streams[r]), "cudaStreamSynchronize");
      } else {
        ctx.all_reduce(ReduceOp::kSum, {{g[r].data(), n}});
      }
      for (std::size_t i = 0; i < n; ++i) w[r][i] -= 0.5f * g[r][i];
    });
  }
  if (gpu) {
    for (std::size_t r = 0; r < k; ++r) {
      cudaFree(dw[r]);
      cudaFree(dg[r]);
      cudaStreamDestroy(streams[r]);
    }
  }
  return w;
}

void check_against_cpu(int k) {
  std::vector<std::vector<float>> cpu;
  {
    auto strategy = make(k, mwms::ReplicaDevice::kCpu);
    cpu = train(strategy, false);
  }
  auto strategy = make(k, mwms::ReplicaDevice::kGpu);
  std::vector<int> devices(static_cast<std::size_t>(k), -1);
  strategy.run([&](const ReplicaContext& ctx) {
    devices[static_cast<std::size_t>(ctx.local_replica_id)] = ctx.device;
  });
  for (int r = 0; r < k; ++r) CHECK(devices[static_cast<std::size_t>(r)] == r);
  const auto gpu = train(strategy, true);
  for (int r = 0; r < k; ++r) {
    INFO("K " << k << " replica " << r);
    CHECK(gpu[static_cast<std::size_t>(r)] == cpu[static_cast<std::size_t>(r)]);  // bit for bit
  }
  // kMean: NCCL's sum, then the division kernel on each replica's device.
  std::vector<std::vector<float>> mean(static_cast<std::size_t>(k));
  strategy.run([&](const ReplicaContext& ctx) {
    const auto r = static_cast<std::size_t>(ctx.local_replica_id);
    std::vector<float> host(1000, 3.0f * static_cast<float>(ctx.local_replica_id + 1));
    float* d = nullptr;
    cu::check(cudaSetDevice(ctx.device), "cudaSetDevice");
    cu::check(cudaMalloc(reinterpret_cast<void**>(&d), host.size() * sizeof(float)), "cudaMalloc");
    cu::check(cudaMemcpy(d, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice),
              "cudaMemcpy");
    ctx.all_reduce(ReduceOp::kMean, {{d, host.size()}}, mwms::DeviceStream{});
    cu::check(cudaMemcpy(host.data(), d, host.size() * sizeof(float), cudaMemcpyDeviceToHost),
              "cudaMemcpy");
    cudaFree(d);
    mean[r] = host;
  });
  const float want = 3.0f * static_cast<float>(k + 1) / 2.0f;  // mean of 3, 6, ..
  for (const auto& m : mean) CHECK(m == std::vector<float>(1000, want));
  strategy.finalize();
}

}  // namespace

TEST_CASE("K = 1 GPU replica ends bit for bit where one CPU replica ends", "[cuda][replicas]") {
  check_against_cpu(1);
}

TEST_CASE("K = 2 GPU replicas (two GPUs) end bit for bit where 2 CPU replicas end",
          "[cuda][replicas]") {
  int devices = 0;
  cu::check(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
  if (devices < 2) {
    WARN("one GPU: K = 2 GPU replicas need two (NCCL refuses two ranks on one device)");
    return;
  }
  check_against_cpu(2);
}
