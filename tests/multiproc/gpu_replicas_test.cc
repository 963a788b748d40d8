// Multi-worker GPU replicas (Note [gpu replicas]) across real processes: W workers x K GPU
// replicas are W·K NCCL ranks of one world (rank = worker·K + local replica, the unique id from
// worker 0's broadcast), here over the fake NCCL spanning the forked ranks (support/fake_nccl.h,
// Note [fake nccl across processes]; "device" buffers are host memory, no GPU needed). A small
// model trained by the W·K GPU replicas ends where the same run with CPU replicas ends, and a
// worker that dies mid-step fails the others with a PeerError naming its NCCL ranks, not a hang,
// and one that stalls with the TimeoutError of the collective's deadline.
#include <catch2/catch.hpp>

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <new>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "collective/device_communicator.h"
#include "multiproc/launcher.h"
#include "mwms/mwms.h"
#include "strategy/device_replicas.h"
#include "support/fake_nccl.h"
#include "support/replicas.h"

namespace {

using Catch::Matchers::Contains;
using mwms::ReduceOp;
using mwms::ReplicaContext;
using mwms::testing::FakeNcclWorld;

// support/replicas.h's linear model; throws unless this worker's replicas end bit-identical; returns
// replica 0's weights.
std::vector<float> train(mwms::MultiWorkerMirroredStrategy& strategy, bool device) {
  const std::vector<std::vector<float>> w = mwms::testing::train_replica_model(strategy, device);
  for (std::size_t r = 1; r < w.size(); ++r) {
    if (w[r] != w[0]) {
      throw std::runtime_error("local replica " + std::to_string(r) + " differs from replica 0");
    }
  }
  return w[0];
}

std::vector<float> parse_floats(const std::string& text) {
  std::vector<float> out;
  const std::size_t at = text.find("weights:");
  if (at == std::string::npos) return out;
  std::istringstream in(text.substr(at + 8));
  float x;
  while (in >> x) out.push_back(x);
  return out;
}

mwms::MultiWorkerMirroredStrategy make(const std::string& tf, int k, mwms::ReplicaDevice device,
                                       double timeout) {
  mwms::CommunicationOptions options;
  options.timeout_seconds = timeout;
  mwms::ReplicaOptions replicas;
  replicas.local_replicas = k;
  replicas.device = device;
  return mwms::MultiWorkerMirroredStrategy(mwms::resolve_tf_config(tf), options, replicas);
}

// Every worker's final weights ("weights: ..." per rank) of W workers x K replicas on `device`;
// with GPU replicas each worker also reports its NCCL ranks, world size, the unique id and its
// replicas' devices.
std::vector<mwms::testing::ChildResult> run(int workers, int k, mwms::ReplicaDevice device) {
  mwms::testing::LaunchOptions launch;
  launch.world_size = workers;
  launch.timeout_seconds = 60;
  const bool gpu = device == mwms::ReplicaDevice::kGpu;
  return mwms::testing::run_ranks(launch, [&](int, const std::string& tf, auto report) {
    if (gpu) mwms::strategy::set_nccl_api_for_testing(&mwms::testing::fake_nccl_api());
    auto strategy = make(tf, k, device, 30);
    if (strategy.num_replicas_in_sync() != workers * k) {
      throw std::runtime_error("bad replica count");
    }
    std::ostringstream out;
    if (gpu) {
      FakeNcclWorld& world = FakeNcclWorld::get();
      std::lock_guard<std::mutex> lock(world.mutex);
      out << "ranks:";
      for (const auto& c : world.comms) out << " " << c->rank << "/" << c->world_size;
      out << " id " << mwms::collective::to_hex(world.comms.at(0)->id).substr(0, 32) << "\n";
    }
    if (gpu) {
      std::vector<int> devices(static_cast<std::size_t>(k), -1);
      strategy.run([&](const ReplicaContext& ctx) {
        devices[static_cast<std::size_t>(ctx.local_replica_id)] = ctx.device;
      });
      out << "devices:";
      for (int d : devices) out << " " << d;
      out << "\n";
    }
    out.precision(9);
    out << "weights:";
    for (float x : train(strategy, gpu)) out << " " << x;
    strategy.finalize();  // GPU replicas: their K NCCL communicators first
    if (gpu) {
      FakeNcclWorld& world = FakeNcclWorld::get();
      out << "\nfinalized " << world.finalizes << " destroyed " << world.destroys << " aborted "
          << world.aborts << "\n";
    }
    report(out.str());
  });
}

// `workers` worker processes x `k` GPU replicas over the fake NCCL spanning them (collective
// timeout `timeout` s): each replica all-reduces its 100 ones on the device `steps` times, calling
// fault(rank, step) first in each step. Each worker reports "step S <sum>" after every step, then
// "run returned" or "<PeerError|TimeoutError|Error>: <what>" for the error that stopped it, then
// calls after(); the parent makes the fake's shared world before the fork.
std::vector<mwms::testing::ChildResult> run_faulty_steps(
    int workers, int k, double timeout, int steps, const std::function<void(int, int)>& fault,
    const std::function<void()>& after) {
  mwms::testing::FakeNcclProcesses fake;
  mwms::testing::LaunchOptions launch;
  launch.world_size = workers;
  launch.timeout_seconds = 60;
  return mwms::testing::run_ranks(launch, [&](int rank, const std::string& tf, auto report) {
    mwms::strategy::set_nccl_api_for_testing(&mwms::testing::fake_nccl_api());
    auto strategy = make(tf, k, mwms::ReplicaDevice::kGpu, timeout);
    std::vector<std::vector<float>> g(static_cast<std::size_t>(k), std::vector<float>(100, 1.0f));
    try {
      for (int step = 0; step < steps; ++step) {
        strategy.run([&](const ReplicaContext& ctx) {
          fault(rank, step);
          auto& mine = g[static_cast<std::size_t>(ctx.local_replica_id)];
          ctx.all_reduce(ReduceOp::kSum, {{mine.data(), mine.size()}}, mwms::DeviceStream{});
        });
        report("step " + std::to_string(step) + " " + std::to_string(g[0][0]) + "\n");
      }
      report("run returned\n");
    } catch (const mwms::PeerError& e) {
      report(std::string("PeerError: ") + e.what() + "\n");
    } catch (const mwms::TimeoutError& e) {
      report(std::string("TimeoutError: ") + e.what() + "\n");
    } catch (const mwms::Error& e) {
      report(std::string("Error: ") + e.what() + "\n");
    }
    after();
  });
}

}  // namespace

TEST_CASE("GPU replicas of 2-3 workers x K = 1, 2 over the fake NCCL across processes end with "
          "the weights of CPU replicas", "[tcp][multiproc][nccl][strategy]") {
  const std::pair<int, int> shapes[] = {{2, 1}, {2, 2}, {3, 2}};
  for (const auto& [workers, k] : shapes) {
    INFO(workers << " worker(s) x " << k << " GPU replica(s)");
    const auto cpu = run(workers, k, mwms::ReplicaDevice::kCpu);
    std::vector<mwms::testing::ChildResult> gpu;
    {
      mwms::testing::FakeNcclProcesses fake;  // before the fork: every child shares the world
      gpu = run(workers, k, mwms::ReplicaDevice::kGpu);
    }
    INFO("CPU:\n" << mwms::testing::describe(cpu) << "GPU:\n" << mwms::testing::describe(gpu));
    REQUIRE(cpu.size() == static_cast<std::size_t>(workers));
    REQUIRE(gpu.size() == static_cast<std::size_t>(workers));
    const std::vector<float> first = parse_floats(gpu[0].output);
    REQUIRE(first.size() == static_cast<std::size_t>(mwms::testing::kLinearIn *
                                                      mwms::testing::kLinearOut));
    const std::string id = gpu[0].output.substr(gpu[0].output.find(" id ") + 4, 32);
    for (int w = 0; w < workers; ++w) {
      const auto& c = cpu[static_cast<std::size_t>(w)];
      const auto& g = gpu[static_cast<std::size_t>(w)];
      INFO("worker " << w);
      REQUIRE(c.exit_code == 0);
      REQUIRE(g.exit_code == 0);
      // Worker w's replicas are NCCL ranks w·K .. w·K + K - 1 of W·K, from worker 0's id.
      std::string ranks = "ranks:";
      for (int r = 0; r < k; ++r) {
        ranks += " " + std::to_string(w * k + r) + "/" + std::to_string(workers * k);
      }
      CHECK_THAT(g.output, Contains(ranks + " id " + id));
      // ... on CUDA devices local_rank·K + r, local_rank counting the workers on its host.
      const auto hosts = static_cast<int>(mwms::testing::test_hosts().size());
      int local_rank = 0;
      for (int q = 0; q < w; ++q) {
        const bool same_host = hosts == 0 || mwms::testing::host_of(q, workers, hosts) ==
                                                 mwms::testing::host_of(w, workers, hosts);
        local_rank += same_host ? 1 : 0;
      }
      std::string devices = "devices:";
      for (int r = 0; r < k; ++r) devices += " " + std::to_string(local_rank * k + r);
      CHECK_THAT(g.output, Contains(devices + "\n"));
      // strategy.finalize() finalized and destroyed each of the worker's K NCCL communicators.
      CHECK_THAT(g.output, Contains("finalized " + std::to_string(k) + " destroyed " +
                                    std::to_string(k) + " aborted 0\n"));
      const std::vector<float> want = parse_floats(c.output), got = parse_floats(g.output);
      REQUIRE(got.size() == want.size());
      REQUIRE(want.size() == first.size());
      for (std::size_t i = 0; i < got.size(); ++i) {
        INFO("weight " << i);
        // Every NCCL rank receives the same sum: the workers agree bit for bit.
        CHECK(got[i] == first[i]);
        // The CPU path sums each worker's replicas first, then across workers; NCCL sums the
        // W·K ranks in one order: the tolerance of strategy_equivalence_test (a few float32
        // ulps per step; a replica's rows lost or counted twice moves weights by > 1e-2).
        CHECK(got[i] == Approx(want[i]).epsilon(1e-5).margin(1e-6));
      }
    }
  }
}

TEST_CASE("a worker of GPU replicas that dies mid-step fails the others' NCCL ranks with a "
          "PeerError naming its NCCL ranks, not a hang", "[tcp][multiproc][nccl][strategy][fault]") {
  // 3 workers x K = 2: worker 2 exits at the start of step 2, before its replicas enqueue the
  // all-reduce; the others' replica 0 waits in the NCCL group, the fake reports the closed peer
  // (ncclRemoteError naming NCCL ranks 4 and 5, worker 2's replicas), all their communicators
  // are aborted and run() throws the PeerError, well before the 20 s collective timeout.
  constexpr int kWorkers = 3, kK = 2, kVictim = 2, kTimeout = 20;
  // Survivors that caught their error. Each stays alive until all have (at most 10 s): a
  // survivor that exited first would be a dead peer too, and the others might name it instead.
  void* map = ::mmap(nullptr, sizeof(std::atomic<int>), PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  REQUIRE(map != MAP_FAILED);
  auto* failed = new (map) std::atomic<int>(0);
  const auto results = run_faulty_steps(
      kWorkers, kK, kTimeout, 4,
      [](int rank, int step) {
        if (rank == kVictim && step == 2) ::_exit(7);  // mid-step, any replica's thread
      },
      [&] {
        ++*failed;
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (failed->load() < kWorkers - 1 && std::chrono::steady_clock::now() < until) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
      });
  ::munmap(map, sizeof(std::atomic<int>));
  INFO(mwms::testing::describe(results));
  REQUIRE(results.size() == static_cast<std::size_t>(kWorkers));
  CHECK(results[kVictim].exit_code == 7);
  for (int w = 0; w < kWorkers; ++w) {
    if (w == kVictim) continue;
    const auto& r = results[static_cast<std::size_t>(w)];
    INFO("worker " << w);
    CHECK(r.exit_code == 0);
    // Two steps summed 6 replicas' ones: 6, then 36.
    CHECK_THAT(r.output, Contains("step 0 6.000000") && Contains("step 1 36.000000"));
    // The dead worker's NCCL ranks are 4 and 5; a survivor names those of them it was waiting
    // for when it noticed (under ThreadSanitizer's slowness, sometimes only rank 5).
    CHECK_THAT(r.output, Contains("PeerError: ") && Contains("exited") &&
                             (Contains("NCCL rank(s) 4, 5 (process") ||
                              Contains("NCCL rank(s) 4 (process") ||
                              Contains("NCCL rank(s) 5 (process")));
    CHECK(r.seconds < kTimeout);  // failed when the peer died, not at the deadline
  }
}

TEST_CASE("a worker of GPU replicas that stalls mid-step fails the others' NCCL ranks with a "
          "TimeoutError at the collective's deadline", "[tcp][multiproc][nccl][strategy][fault]") {
  // 2 workers x K = 2: worker 1 sleeps 3 s in step 1 before its replicas enqueue; worker 0's
  // NCCL group stays pending (the fake never waits), so its 1 s deadline aborts its
  // communicators and run() throws the TimeoutError naming the local replicas still waiting.
  constexpr int kWorkers = 2, kK = 2, kStalled = 1;
  constexpr double kTimeout = 1;
  const auto results = run_faulty_steps(
      kWorkers, kK, kTimeout, 3,
      [](int rank, int step) {
        if (rank == kStalled && step == 1) ::usleep(3000 * 1000);
      },
      [] {});
  INFO(mwms::testing::describe(results));
  REQUIRE(results.size() == static_cast<std::size_t>(kWorkers));
  const auto& r = results[0];
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Contains("step 0 4.000000") && !Contains("step 1 "));
  CHECK_THAT(r.output, Contains("TimeoutError: nccl replica group all_reduce seq 1") &&
                           Contains("local replica(s) 0, 1") && Contains("aborted"));
  CHECK(r.seconds < 10);  // the deadline, not the stalled worker's return nor the launcher's kill
}
