// gpu:nccl1 — the NCCL backend over the real NCCL with one rank on the device: the non-blocking
// init with our unique id, every collective on device buffers on a stream, a bucket as a group,
// the mean's division on the device, Work completion through CUDA events, and
// DeviceCommunicator::create for a world of one. Skipped (exit 77) without a device.
#include <cuda_runtime.h>

#include <catch2/catch.hpp>

#include <vector>

#include "collective/backend/nccl_backend.h"
#include "kernels/cuda/cuda_kernels.h"
#include "mwms/device_communicator.h"

namespace {

namespace mc = mwms::collective;
namespace cu = mwms::kernels::cuda;
using mwms::DataType;
using mwms::ReduceOp;

float* device_floats(const std::vector<float>& host) {
  void* p = nullptr;
  cu::check(cudaMalloc(&p, host.size() * sizeof(float)), "cudaMalloc");
  cu::check(cudaMemcpy(p, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice),
            "cudaMemcpy");
  return static_cast<float*>(p);
}

std::vector<float> host_floats(const float* d, std::size_t n) {
  std::vector<float> h(n);
  cu::check(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
  return h;
}

}  // namespace

TEST_CASE("one-rank NCCL: every collective on device buffers completes through events", "[cuda][nccl]") {
  const mc::NcclApi* api = mc::real_nccl_api();
  REQUIRE(api != nullptr);
  mc::NcclUniqueId id;
  REQUIRE(api->get_unique_id(&id) == mc::kNcclSuccess);
  mc::NcclBackendOptions o;
  o.timeout_seconds = 60;
  o.init_timeout_seconds = 60;
  mc::NcclBackend backend(*api, id, o);
  CHECK(backend.device() == 0);
  cudaStream_t stream = nullptr;
  cu::check(cudaStreamCreate(&stream), "cudaStreamCreate");

  std::vector<float> h(1 << 20);
  for (std::size_t i = 0; i < h.size(); ++i) h[i] = static_cast<float>(i % 1000) - 500.0f;
  float* a = device_floats(h);
  float* b = device_floats(std::vector<float>(h.size(), 0.0f));
  mc::DeviceCall ar{mc::DeviceCollective::kAllReduce, a, a, h.size(), DataType::kFloat32,
                    ReduceOp::kSum, 0};
  auto work = backend.launch(&ar, 1, stream);
  work->wait();
  CHECK(work->test());
  CHECK(host_floats(a, h.size()) == h);  // a world of one sums to itself
  mc::DeviceCall calls[] = {
      {mc::DeviceCollective::kReduceScatter, a, b, h.size(), DataType::kFloat32, ReduceOp::kMean, 0},
      {mc::DeviceCollective::kAllGather, a, b, h.size(), DataType::kFloat32, ReduceOp::kSum, 0},
      {mc::DeviceCollective::kBroadcast, a, b, h.size(), DataType::kFloat32, ReduceOp::kSum, 0}};
  for (const mc::DeviceCall& c : calls) {
    cu::check(cudaMemset(b, 0, h.size() * sizeof(float)), "cudaMemset");
    backend.launch(&c, 1, stream)->wait();
    INFO(mc::to_string(c.kind));
    CHECK(host_floats(b, h.size()) == h);
  }
  // A bucket as one group.
  float* c = device_floats(std::vector<float>(1000, 2.0f));
  mc::DeviceCall bucket[] = {ar, {mc::DeviceCollective::kAllReduce, c, c, 1000, DataType::kFloat32,
                                  ReduceOp::kMax, 0}};
  backend.launch(bucket, 2, stream)->wait();
  CHECK(host_floats(c, 1000) == std::vector<float>(1000, 2.0f));
  CHECK(backend.seq() == 5);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  cudaStreamDestroy(stream);
}

TEST_CASE("DeviceCommunicator::create for a world of one", "[cuda][nccl]") {
  mwms::CommunicatorOptions o;
  o.timeout_seconds = 60;
  auto comm = mwms::DeviceCommunicator::create(mwms::resolve_from_environment(), o);
  CHECK(comm->world_size() == 1);
  std::vector<float> h(4096, 3.0f);
  float* d = device_floats(h);
  comm->all_reduce(d, h.size(), DataType::kFloat32, ReduceOp::kMean)->wait();
  CHECK(host_floats(d, h.size()) == h);
  mwms::DeviceTensor t{d, 10};
  comm->all_reduce_bucket_async(&t, 1, DataType::kFloat32, ReduceOp::kSum)->wait();
  CHECK(comm->describe().find("nccl (device 0, world size 1)") == 0);
  comm->barrier();  // Note [nccl barrier]: one element of its own device buffer
  comm->finalize();
  CHECK_THROWS_AS(comm->all_reduce(d, 1, DataType::kFloat32, ReduceOp::kSum), mwms::InvalidUsage);
  cudaFree(d);
}
