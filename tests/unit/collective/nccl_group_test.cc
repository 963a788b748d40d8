// K NCCL ranks in one process (collective/backend/nccl_group.h, Note [nccl replica group]) driven
// through the fake NcclApi (support/fake_nccl.h): "workers" are threads, each with a group of K
// communicators of one world of workers x K ranks. The K inits in one NCCL group, the grouped
// all-reduce / mean / broadcast of every replica's buffer, and the timeout/abort path across the
// K communicators (a worker that never calls; an asynchronous error; an init that never ends).
#include "collective/backend/nccl_group.h"

#include <catch2/catch.hpp>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "support/fake_nccl.h"
#include "support/thread_expect.h"

namespace {

using mwms::DataType;
using mwms::ReduceOp;
namespace mc = mwms::collective;
using Catch::Matchers::Contains;
using mwms::testing::FakeNcclWorld;
using mwms::testing::expect;  // not Catch2 in the worker threads: support/thread_expect.h
using mwms::testing::fake_nccl_api;

mc::NcclGroupOptions group_options(int worker, int workers, int k, double timeout = 5) {
  mc::NcclGroupOptions o;
  o.first_rank = worker * k;
  o.world_size = workers * k;
  for (int r = 0; r < k; ++r) o.devices.push_back(r);
  o.timeout_seconds = timeout;
  o.init_timeout_seconds = 5;
  o.context.rank = worker;
  o.context.world_size = workers;
  o.context.task = "worker " + std::to_string(worker);
  return o;
}

mc::DeviceCall call(mc::DeviceCollective kind, float* buf, std::size_t n,
                    ReduceOp op = ReduceOp::kSum) {
  return {kind, buf, buf, n, DataType::kFloat32, op, 0};
}

// Runs body(worker, group) on `workers` threads, each with its group of K communicators.
template <typename Body>
void run_workers(int workers, int k, double timeout, Body body) {
  mc::NcclUniqueId id;
  fake_nccl_api().get_unique_id(&id);
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      mc::NcclReplicaGroup group(fake_nccl_api(), id, group_options(w, workers, k, timeout));
      body(w, group);
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace

TEST_CASE("nccl replica group: K inits in one group, grouped all-reduce, mean and broadcast",
          "[unit][nccl]") {
  for (int workers : {1, 2}) {
    for (int k : {1, 2, 3}) {
      INFO(workers << " worker(s) x " << k << " local replica(s)");
      FakeNcclWorld::get().reset();
      FakeNcclWorld::get().init_polls = 3;
      const int world = workers * k;
      std::vector<std::string> errors(static_cast<std::size_t>(workers));
      std::vector<std::vector<float>> got(static_cast<std::size_t>(world));
      run_workers(workers, k, 5, [&](int w, mc::NcclReplicaGroup& group) {
        try {
          expect(group.size() == k, "group.size() == k");
          for (int r = 0; r < k; ++r) expect(group.device(r) == r, "group.device(r) == r");
          // Per replica: a (sum), m (mean), b (broadcast from NCCL rank 0): 3 calls each.
          std::vector<std::vector<float>> a(static_cast<std::size_t>(k)), m = a, b = a;
          std::vector<mc::DeviceCall> calls;
          std::vector<void*> streams(static_cast<std::size_t>(k), nullptr);
          for (int r = 0; r < k; ++r) {
            const int rank = w * k + r;
            a[r].assign(5, static_cast<float>(rank + 1));
            m[r].assign(3, static_cast<float>(2 * rank));
            b[r].assign(4, 100.0f + static_cast<float>(rank));
          }
          for (int r = 0; r < k; ++r) {
            calls.push_back(call(mc::DeviceCollective::kAllReduce, a[r].data(), 5));
            calls.push_back(
                call(mc::DeviceCollective::kAllReduce, m[r].data(), 3, ReduceOp::kMean));
            calls.push_back(call(mc::DeviceCollective::kBroadcast, b[r].data(), 4));
          }
          auto work = group.launch(calls.data(), 3, streams.data());
          work->wait();
          expect(work->test(), "work->test()");
          expect(group.seq() == 1, "group.seq() == 1");
          for (int r = 0; r < k; ++r) {
            got[static_cast<std::size_t>(w * k + r)] = {a[r][0], a[r][4], m[r][2], b[r][3]};
          }
        } catch (const std::exception& e) {
          errors[static_cast<std::size_t>(w)] = e.what();
        }
      });
      for (const std::string& e : errors) CHECK(e.empty());
      // sum of 1..world; mean of 0, 2, .., 2(world-1) = world - 1; rank 0's 100.
      const float sum = static_cast<float>(world * (world + 1) / 2);
      for (int rank = 0; rank < world; ++rank) {
        INFO("rank " << rank);
        CHECK(got[static_cast<std::size_t>(rank)] ==
              std::vector<float>{sum, sum, static_cast<float>(world - 1), 100.0f});
      }
      FakeNcclWorld& fake = FakeNcclWorld::get();
      REQUIRE(fake.comms.size() == static_cast<std::size_t>(world));
      for (const auto& c : fake.comms) {
        CHECK(c->world_size == world);
        CHECK(c->id.bytes == fake.made_id.bytes);  // one unique id for the whole world
      }
      // One group for the K inits and one for the launch, per worker.
      CHECK(fake.groups == 2 * workers);
      CHECK(fake.divisions == world);  // the mean's division on every replica's device
      CHECK(fake.destroys == world);   // finalized and destroyed, none aborted
      CHECK(fake.aborts == 0);
    }
  }
}

TEST_CASE("nccl replica group: a worker that never calls makes the others time out and abort "
          "all K communicators", "[unit][nccl][fault]") {
  FakeNcclWorld::get().reset();
  constexpr int kWorkers = 2, kK = 2;
  std::string error, later;
  double seconds = 0;
  run_workers(kWorkers, kK, 0.3, [&](int w, mc::NcclReplicaGroup& group) {
    if (w == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(800));  // alive, never calls
      return;
    }
    std::vector<std::vector<float>> a(kK, std::vector<float>(4, 1.0f));
    std::vector<mc::DeviceCall> calls;
    for (auto& buf : a) calls.push_back(call(mc::DeviceCollective::kAllReduce, buf.data(), 4));
    std::vector<void*> streams(kK, nullptr);
    auto work = group.launch(calls.data(), 1, streams.data());
    CHECK_FALSE(work->test());
    const auto start = std::chrono::steady_clock::now();
    try {
      work->wait();
    } catch (const mwms::TimeoutError& e) {
      error = e.what();
      CHECK(e.context().rank == 0);
      CHECK(e.context().op == "all_reduce");
    }
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    try {
      group.launch(calls.data(), 1, streams.data());
    } catch (const mwms::InvalidUsage& e) {
      later = e.what();
    }
  });
  CHECK_THAT(error, Contains("did not complete within 0.3 s on local replica(s) 0, 1") &&
                        Contains("all local NCCL communicators were aborted"));
  CHECK(seconds < 2.0);
  CHECK_THAT(later, Contains("poisoned") && Contains("did not complete"));
  // Both of worker 0's communicators aborted; worker 1's finalized normally.
  CHECK(FakeNcclWorld::get().comm_of_rank(0)->aborted);
  CHECK(FakeNcclWorld::get().comm_of_rank(1)->aborted);
  CHECK(FakeNcclWorld::get().aborts == kK);
  CHECK(FakeNcclWorld::get().destroys == kK);
}

TEST_CASE("nccl replica group: an asynchronous error on one communicator is a PeerError and "
          "aborts all K", "[unit][nccl][fault]") {
  FakeNcclWorld::get().reset();
  mc::NcclUniqueId id;
  mc::NcclReplicaGroup group(fake_nccl_api(), id, group_options(0, 2, 3));  // worker 1 absent
  std::vector<std::vector<float>> a(3, std::vector<float>(4, 1.0f));
  std::vector<mc::DeviceCall> calls;
  for (auto& buf : a) calls.push_back(call(mc::DeviceCollective::kAllReduce, buf.data(), 4));
  std::vector<void*> streams(3, nullptr);
  auto work = group.launch(calls.data(), 1, streams.data());
  FakeNcclWorld::get().comm_of_rank(1)->async_error = mc::kNcclRemoteError;
  try {
    work->wait();
    FAIL("no error");
  } catch (const mwms::PeerError& e) {
    CHECK_THAT(std::string(e.what()), Contains("NCCL error 6") && Contains("local replica 1"));
  }
  CHECK(FakeNcclWorld::get().aborts == 3);
  CHECK_THROWS_AS(group.launch(calls.data(), 1, streams.data()), mwms::InvalidUsage);
}

TEST_CASE("nccl replica group: an init that never completes times out and aborts all K",
          "[unit][nccl][fault]") {
  FakeNcclWorld::get().reset();
  FakeNcclWorld::get().init_never_completes = true;
  mc::NcclUniqueId id;
  mc::NcclGroupOptions o = group_options(0, 1, 2);
  o.init_timeout_seconds = 0.2;
  try {
    mc::NcclReplicaGroup group(fake_nccl_api(), id, o);
    FAIL("init completed");
  } catch (const mwms::TimeoutError& e) {
    CHECK_THAT(std::string(e.what()),
               Contains("ncclCommInitRankConfig still in progress on local replica(s) 0, 1 after "
                        "0.2 s"));
    CHECK(e.context().op == "nccl group init");
  }
  CHECK(FakeNcclWorld::get().aborts == 2);
  CHECK(FakeNcclWorld::get().groups == 1);
  // Ranks that do not fit the world are the caller's bug.
  mc::NcclGroupOptions bad = group_options(1, 1, 2);
  CHECK_THROWS_AS(mc::NcclReplicaGroup(fake_nccl_api(), id, bad), mwms::InvalidArgument);
}

TEST_CASE("nccl replica group: more replicas than CUDA devices is an InvalidUsage, not NCCL's "
          "duplicate GPU", "[unit][nccl][fault]") {
  FakeNcclWorld::get().reset();
  FakeNcclWorld::get().device_count = 2;  // set_device wraps local ranks modulo 2
  mc::NcclUniqueId id;
  fake_nccl_api().get_unique_id(&id);
  try {
    mc::NcclReplicaGroup group(fake_nccl_api(), id, group_options(0, 1, 3));
    FAIL("three replicas on two devices were accepted");
  } catch (const mwms::InvalidUsage& e) {
    CHECK_THAT(std::string(e.what()),
               Contains("local replica 0 and local replica 2 would share CUDA device 0") &&
                   Contains("fewer CUDA devices"));
  }
  CHECK(FakeNcclWorld::get().groups == 1);  // the group was closed
  FakeNcclWorld::get().reset();
}

TEST_CASE("nccl replica group: a failing NCCL call names the replica, an invalid argument leaves "
          "the group usable", "[unit][nccl]") {
  FakeNcclWorld::get().reset();
  FakeNcclWorld::get().init_polls = 0;
  mc::NcclUniqueId id;
  mc::NcclReplicaGroup group(fake_nccl_api(), id, group_options(0, 1, 2));
  std::vector<std::vector<float>> a(2, std::vector<float>(4, 1.0f));
  std::vector<mc::DeviceCall> calls;
  for (auto& buf : a) calls.push_back(call(mc::DeviceCollective::kAllReduce, buf.data(), 4));
  std::vector<void*> streams(2, nullptr);
  FakeNcclWorld::get().fail("all_reduce", mc::kNcclInvalidArgument);
  try {
    group.launch(calls.data(), 1, streams.data());
    FAIL("no error");
  } catch (const mwms::BackendError& e) {
    CHECK(e.native_code() == mc::kNcclInvalidArgument);
    CHECK_THAT(std::string(e.what()), Contains("nccl all_reduce (local replica 0)"));
  }
  FakeNcclWorld::get().clear("all_reduce");
  group.launch(calls.data(), 1, streams.data())->wait();
  CHECK(a[1][0] == 2.0f);
  CHECK(FakeNcclWorld::get().aborts == 0);
  calls[1].recv = nullptr;
  CHECK_THROWS_WITH(group.launch(calls.data(), 1, streams.data()),
                    Contains("local replica 1: null device buffer"));
}

TEST_CASE("nccl replica group: finalize destroys the K communicators once, a stuck one times out",
          "[unit][nccl]") {
  SECTION("2 workers x 2 replicas finalize; later launches are refused") {
    FakeNcclWorld::get().reset();
    std::vector<std::string> after(2);
    run_workers(2, 2, 5, [&](int w, mc::NcclReplicaGroup& group) {
      try {
        std::vector<std::vector<float>> a(2, std::vector<float>(3, 1.0f));
        std::vector<mc::DeviceCall> calls = {call(mc::DeviceCollective::kAllReduce, a[0].data(), 3),
                                             call(mc::DeviceCollective::kAllReduce, a[1].data(), 3)};
        std::vector<void*> streams(2, nullptr);
        group.launch(calls.data(), 1, streams.data());  // finalize waits for it
        group.finalize();
        expect(a[0][2] == 4.0f && a[1][0] == 4.0f, "the launch completed before finalize returned");
        group.finalize();  // a second call does nothing
        try {
          group.launch(calls.data(), 1, streams.data());
          after[static_cast<std::size_t>(w)] = "launch accepted";
        } catch (const mwms::InvalidUsage& e) {
          after[static_cast<std::size_t>(w)] = e.what();
        }
      } catch (const std::exception& e) {
        after[static_cast<std::size_t>(w)] = std::string("threw: ") + e.what();
      }
    });
    for (const std::string& a : after) CHECK_THAT(a, Contains("the NCCL replica group was finalized"));
    CHECK(FakeNcclWorld::get().finalizes == 4);
    CHECK(FakeNcclWorld::get().destroys == 4);  // not again in the destructors
    CHECK(FakeNcclWorld::get().aborts == 0);
  }
  SECTION("a finalize that never completes: TimeoutError naming a replica, all K aborted") {
    FakeNcclWorld::get().reset();
    FakeNcclWorld::get().finalize_polls = 1 << 30;
    std::string error;
    run_workers(1, 2, 0.2, [&](int, mc::NcclReplicaGroup& group) {
      try {
        group.finalize();
        error = "finalize completed";
      } catch (const mwms::TimeoutError& e) {
        error = e.what();
      }
    });
    CHECK_THAT(error, Contains("ncclCommFinalize of local replica 0 did not complete within 0.2 s"));
    CHECK(FakeNcclWorld::get().aborts == 2);
    CHECK(FakeNcclWorld::get().destroys == 0);
  }
}
