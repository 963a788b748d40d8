// GPU replicas of the strategy (ReplicaOptions::device = kGpu, Note [gpu replicas]) driven through
// the fake NCCL (support/fake_nccl.h: "device" buffers are host memory), one worker: the K NCCL
// communicators made in one group from worker 0's unique id, each replica's device, the device
// broadcast and all-reduce as one NCCL group across the K replicas, a small model trained by K
// GPU replicas ending bit for bit where K CPU replicas end (both combine the replicas in replica
// order), and a failing replica failing its siblings. No GPU needed; gpu:replicas runs K = 1 on a
// real device.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

#include "mwms/mwms.h"
#include "strategy/device_replicas.h"
#include "support/fake_nccl.h"
#include "support/replicas.h"

namespace {

using Catch::Matchers::Contains;
using mwms::ReduceOp;
using mwms::ReplicaContext;
using mwms::testing::FakeNcclWorld;

// Uses the fake NCCL for the strategies made while it lives.
struct FakeNcclScope {
  FakeNcclScope() {
    FakeNcclWorld::get().reset();
    mwms::strategy::set_nccl_api_for_testing(&mwms::testing::fake_nccl_api());
  }
  ~FakeNcclScope() { mwms::strategy::set_nccl_api_for_testing(nullptr); }
};

mwms::MultiWorkerMirroredStrategy make(int k, mwms::ReplicaDevice device, double timeout = 30) {
  return mwms::testing::make_replicas(k, device, timeout);
}

using mwms::testing::kLinearIn;
using mwms::testing::kLinearOut;
using mwms::testing::kLinearSteps;

// A linear model trained by every local replica on its rows; `device` selects the replicas'
// device collectives (the fake's "device" memory is the same host vectors). Returns every
// replica's final weights.
std::vector<std::vector<float>> train(mwms::MultiWorkerMirroredStrategy& strategy, bool device) {
  return mwms::testing::train_replica_model(strategy, device);
}

}  // namespace

TEST_CASE("GPU replicas over the fake NCCL: K communicators, devices, and the same weights as K "
          "CPU replicas", "[unit][strategy][nccl]") {
  for (int k : {1, 2, 3}) {
    INFO("K " << k);
    std::vector<std::vector<float>> cpu;
    {
      auto strategy = make(k, mwms::ReplicaDevice::kCpu);
      cpu = train(strategy, false);
    }
    FakeNcclScope fake;
    FakeNcclWorld::get().init_polls = 2;
    auto strategy = make(k, mwms::ReplicaDevice::kGpu);
    // One NCCL rank per replica, all from one unique id, made in one group.
    FakeNcclWorld& world = FakeNcclWorld::get();
    REQUIRE(world.comms.size() == static_cast<std::size_t>(k));
    for (int r = 0; r < k; ++r) {
      CHECK(world.comms[static_cast<std::size_t>(r)]->rank == r);
      CHECK(world.comms[static_cast<std::size_t>(r)]->world_size == k);
      CHECK(world.comms[static_cast<std::size_t>(r)]->id.bytes == world.made_id.bytes);
    }
    CHECK(world.unique_ids == 1);
    CHECK(world.groups == 1);
    std::vector<int> devices(static_cast<std::size_t>(k), -2);
    strategy.run([&](const ReplicaContext& ctx) {
      devices[static_cast<std::size_t>(ctx.local_replica_id)] = ctx.device;
    });
    for (int r = 0; r < k; ++r) CHECK(devices[static_cast<std::size_t>(r)] == r);
    const auto gpu = train(strategy, true);
    for (int r = 0; r < k; ++r) {
      INFO("replica " << r);
      CHECK(gpu[static_cast<std::size_t>(r)] == cpu[static_cast<std::size_t>(r)]);  // bit for bit
      CHECK(gpu[static_cast<std::size_t>(r)] == gpu[0]);
    }
    // The broadcast and every step: one NCCL group each, every replica's buffer in it.
    CHECK(world.groups == 2 + kLinearSteps);
    CHECK(world.comms[0]->enqueued == 1 + kLinearSteps);
    // kMean: summed by NCCL, divided on every replica's device by num_replicas_in_sync.
    std::vector<std::vector<double>> m(static_cast<std::size_t>(k), std::vector<double>(3));
    strategy.run([&](const ReplicaContext& ctx) {
      auto& mine = m[static_cast<std::size_t>(ctx.local_replica_id)];
      std::fill(mine.begin(), mine.end(), 2.0 * ctx.local_replica_id);
      ctx.all_reduce(ReduceOp::kMean, {{mine.data(), mine.size(), mwms::DataType::kFloat64}},
                     mwms::DeviceStream{});
    });
    for (const auto& mine : m) CHECK(mine[2] == static_cast<double>(k - 1));
    CHECK(world.divisions == k);
  }
}

// support/replicas.h's device memory as gpu:replicas uses it, in host memory apart from the
// training loop's vectors: the buffers the fake NCCL reduces, and how often each was copied.
class HostReplicaMemory : public mwms::testing::ReplicaDeviceMemory {
 public:
  explicit HostReplicaMemory(int k) : buffers(static_cast<std::size_t>(k) * 2) {}
  float* to_device(const ReplicaContext& ctx, int slot, const float* host,
                   std::size_t n) override {
    std::vector<float>& b = of(ctx, slot);
    b.assign(host, host + n);
    ++to_device_calls[static_cast<std::size_t>(slot)];
    return b.data();
  }
  void to_host(const ReplicaContext& ctx, int slot, float* host, std::size_t n) override {
    std::copy(of(ctx, slot).begin(), of(ctx, slot).begin() + static_cast<std::ptrdiff_t>(n), host);
    ++to_host_calls[static_cast<std::size_t>(slot)];
  }
  mwms::DeviceStream stream(const ReplicaContext&) override { return mwms::DeviceStream{}; }
  std::vector<float>& of(const ReplicaContext& ctx, int slot) {
    return buffers[static_cast<std::size_t>(ctx.local_replica_id * 2 + slot)];
  }
  std::vector<std::vector<float>> buffers;  // replica r's weights at 2r, its gradient at 2r + 1
  std::atomic<int> to_device_calls[2] = {}, to_host_calls[2] = {};
};

TEST_CASE("GPU replicas over the fake NCCL: the model trained through device buffers apart from "
          "the host vectors (as gpu:replicas) ends where K CPU replicas end",
          "[unit][strategy][nccl]") {
  for (int k : {1, 3}) {
    INFO("K " << k);
    std::vector<std::vector<float>> cpu;
    {
      auto strategy = make(k, mwms::ReplicaDevice::kCpu);
      cpu = train(strategy, false);
    }
    FakeNcclScope fake;
    auto strategy = make(k, mwms::ReplicaDevice::kGpu);
    HostReplicaMemory memory(k);
    const auto gpu = mwms::testing::train_replica_model(strategy, true, &memory);
    for (int r = 0; r < k; ++r) {
      INFO("replica " << r);
      CHECK(gpu[static_cast<std::size_t>(r)] == cpu[static_cast<std::size_t>(r)]);  // bit for bit
    }
    // Once per replica for the broadcast, once per replica and step for the gradient; NCCL
    // reduced the device buffers, not the host vectors.
    CHECK(memory.to_device_calls[0] == k);
    CHECK(memory.to_host_calls[0] == k);
    CHECK(memory.to_device_calls[1] == k * kLinearSteps);
    CHECK(memory.to_host_calls[1] == k * kLinearSteps);
    FakeNcclWorld& world = FakeNcclWorld::get();
    REQUIRE(world.comms[0]->ops.size() == 1 + kLinearSteps);
    CHECK(world.comms[0]->ops[0].recv == memory.buffers[0].data());
    CHECK(world.comms[0]->ops[kLinearSteps].recv == memory.buffers[1].data());
  }
}

TEST_CASE("GPU replicas over the fake NCCL: a failing replica fails its siblings, and misuse",
          "[unit][strategy][nccl]") {
  FakeNcclScope fake;
  auto strategy = make(3, mwms::ReplicaDevice::kGpu, 60);
  std::vector<std::vector<float>> g(3, std::vector<float>(10, 1.0f));
  const std::vector<std::string> others = mwms::testing::run_with_failing_replica(
      strategy,
      [&](const ReplicaContext& ctx) {
        auto& mine = g[static_cast<std::size_t>(ctx.local_replica_id)];
        if (ctx.local_replica_id == 2) throw std::runtime_error("replica two's kernel failed");
        ctx.all_reduce(ReduceOp::kSum, {{mine.data(), mine.size()}}, mwms::DeviceStream{});
      },
      "replica two's kernel failed");
  REQUIRE(others.size() == 2);
  for (const auto& what : others) {
    CHECK_THAT(what, Contains("local replica 2") && Contains("all_reduce (device)"));
  }
  CHECK(FakeNcclWorld::get().comms[0]->enqueued == 0);  // nothing reached NCCL
  // Shapes are checked before anything reaches NCCL; host collectives keep working.
  CHECK_THROWS_AS(strategy.run([&](const ReplicaContext& ctx) {
                    auto& mine = g[static_cast<std::size_t>(ctx.local_replica_id)];
                    ctx.all_reduce(ReduceOp::kSum,
                                   {{mine.data(), mine.size() - ctx.local_replica_id}},
                                   mwms::DeviceStream{});
                  }),
                  mwms::InvalidArgument);
  strategy.run([&](const ReplicaContext& ctx) {
    auto& mine = g[static_cast<std::size_t>(ctx.local_replica_id)];
    std::fill(mine.begin(), mine.end(), 1.0f);
    ctx.all_reduce(ReduceOp::kSum, {{mine.data(), mine.size()}});
  });
  CHECK(g[2][9] == 3.0f);
  // Device collectives on CPU replicas are a usage error.
  auto cpu = make(2, mwms::ReplicaDevice::kCpu);
  CHECK_THROWS_WITH(cpu.run([&](const ReplicaContext& ctx) {
                      auto& mine = g[static_cast<std::size_t>(ctx.local_replica_id)];
                      ctx.all_reduce(ReduceOp::kSum, {{mine.data(), 1}}, mwms::DeviceStream{});
                    }),
                    Contains("replicas are on the CPU"));
}

TEST_CASE("GPU replicas without the fake: no NCCL in this build, or no usable device, is an error "
          "naming the cause", "[unit][strategy][nccl]") {
  // The CPU-only build has no NCCL (InvalidUsage); the CUDA build on a machine without a GPU
  // fails in cudaSetDevice (BackendError). A machine with a GPU creates the communicator.
  try {
    auto strategy = make(1, mwms::ReplicaDevice::kGpu);
    SUCCEED("a usable GPU and NCCL: the GPU replica exists");
  } catch (const mwms::InvalidUsage& e) {
    CHECK_THAT(std::string(e.what()), Contains("needs a build with NCCL"));
  } catch (const mwms::BackendError& e) {
    CHECK_THAT(std::string(e.what()), Contains("no usable CUDA device") || Contains("CUDA error"));
  }
}
