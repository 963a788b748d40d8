// gpu:replicas — the strategy's GPU replicas (ReplicaOptions::device = kGpu, Note [gpu replicas])
// over the real NCCL and CUDA runtime: K = 1 GPU replica (one NCCL rank, made through the grouped
// init from our unique id) trains support/replicas.h's linear model (train_replica_model, as
// unit:GPU replicas over the fake NCCL and multiproc:GPU replicas do) with its weights broadcast
// and its gradient all-reduced in device memory on its own stream (CudaReplicaMemory), and must
// end bit for bit where one CPU replica ends; kMean divides on the device; with 2 or more GPUs,
// K = 2 GPU replicas against 2 CPU replicas as well. Skipped (exit 77, gpu_main.cc) without a device.
#include <cuda_runtime.h>

#include <catch2/catch.hpp>

#include <cstddef>
#include <vector>

#include "kernels/cuda/cuda_kernels.h"
#include "mwms/mwms.h"
#include "support/replicas.h"

namespace {

namespace cu = mwms::kernels::cuda;
using mwms::ReduceOp;
using mwms::ReplicaContext;

mwms::MultiWorkerMirroredStrategy make(int k, mwms::ReplicaDevice device) {
  return mwms::testing::make_replicas(k, device, /*timeout_seconds=*/60);
}

// support/replicas.h's device memory over the CUDA runtime: per local replica a stream and the
// weight and gradient buffers on its device (ReplicaContext::device), made on first use in the
// replica's thread; freed, each on its own device, by the destructor after the last run().
class CudaReplicaMemory : public mwms::testing::ReplicaDeviceMemory {
 public:
  explicit CudaReplicaMemory(int k) : replicas_(static_cast<std::size_t>(k)) {}
  ~CudaReplicaMemory() override {
    for (Replica& r : replicas_) {
      if (r.device < 0) continue;
      cudaSetDevice(r.device);
      for (float* b : r.buffers) cudaFree(b);
      if (r.stream != nullptr) cudaStreamDestroy(r.stream);
    }
  }
  CudaReplicaMemory(const CudaReplicaMemory&) = delete;
  CudaReplicaMemory& operator=(const CudaReplicaMemory&) = delete;

  float* to_device(const ReplicaContext& ctx, int slot, const float* host,
                   std::size_t n) override {
    Replica& r = of(ctx);
    float*& buffer = r.buffers[static_cast<std::size_t>(slot)];
    if (buffer == nullptr) {
      cu::check(cudaMalloc(reinterpret_cast<void**>(&buffer), n * sizeof(float)), "cudaMalloc");
    }
    // From pageable memory: returns once `host` has been staged, so the caller may reuse it.
    cu::check(cudaMemcpyAsync(buffer, host, n * sizeof(float), cudaMemcpyHostToDevice, r.stream),
              "cudaMemcpyAsync to the device");
    return buffer;
  }
  void to_host(const ReplicaContext& ctx, int slot, float* host, std::size_t n) override {
    Replica& r = of(ctx);
    cu::check(cudaMemcpyAsync(host, r.buffers[static_cast<std::size_t>(slot)], n * sizeof(float),
                              cudaMemcpyDeviceToHost, r.stream),
              "cudaMemcpyAsync to the host");
    cu::check(cudaStreamSynchronize(r.stream), "cudaStreamSynchronize");
  }
  mwms::DeviceStream stream(const ReplicaContext& ctx) override {
    return mwms::DeviceStream{of(ctx).stream};
  }

 private:
  struct Replica {
    int device = -1;  // -1: nothing made yet
    cudaStream_t stream = nullptr;
    float* buffers[2] = {nullptr, nullptr};  // weights, gradient
  };
  // Replica ctx's state, its device current on this thread and its stream made.
  Replica& of(const ReplicaContext& ctx) {
    Replica& r = replicas_.at(static_cast<std::size_t>(ctx.local_replica_id));
    cu::check(cudaSetDevice(ctx.device), "cudaSetDevice");
    if (r.device < 0) {
      r.device = ctx.device;
      cu::check(cudaStreamCreate(&r.stream), "cudaStreamCreate");
    }
    return r;
  }
  std::vector<Replica> replicas_;
};

void check_against_cpu(int k) {
  std::vector<std::vector<float>> cpu;
  {
    auto strategy = make(k, mwms::ReplicaDevice::kCpu);
    cpu = mwms::testing::train_replica_model(strategy, false);
  }
  auto strategy = make(k, mwms::ReplicaDevice::kGpu);
  std::vector<int> devices(static_cast<std::size_t>(k), -1);
  strategy.run([&](const ReplicaContext& ctx) {
    devices[static_cast<std::size_t>(ctx.local_replica_id)] = ctx.device;
  });
  for (int r = 0; r < k; ++r) CHECK(devices[static_cast<std::size_t>(r)] == r);
  std::vector<std::vector<float>> gpu;
  {
    CudaReplicaMemory memory(k);
    gpu = mwms::testing::train_replica_model(strategy, true, &memory);
  }
  for (int r = 0; r < k; ++r) {
    INFO("K " << k << " replica " << r);
    CHECK(gpu[static_cast<std::size_t>(r)] == cpu[static_cast<std::size_t>(r)]);  // bit for bit
    CHECK(gpu[static_cast<std::size_t>(r)] == gpu[0]);
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
