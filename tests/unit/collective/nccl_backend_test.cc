// The NCCL backend (collective/backend/nccl_backend.h) driven through the fake NcclApi
// (support/fake_nccl.h), ranks as threads: the non-blocking init, completion through events, a
// bucket as one group, the mean's division, Note [nccl deadlines] (a rank that never calls: in
// progress -> timeout -> abort on every other rank, then poisoned), the error mapping of NCCL and
// CUDA codes, and an asynchronous NCCL error becoming a PeerError. No GPU needed.
#include "collective/backend/nccl_backend.h"

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "collective/device_communicator.h"
#include "support/fake_nccl.h"
#include "support/thread_expect.h"

namespace {

using mwms::DataType;
using mwms::ReduceOp;
namespace mc = mwms::collective;
using mwms::testing::FakeNcclWorld;
using mwms::testing::expect;
using mwms::testing::fake_nccl_api;

mc::NcclBackendOptions options_for(int rank, int world, double timeout = 5) {
  mc::NcclBackendOptions o;
  o.rank = rank;
  o.world_size = world;
  o.local_rank = rank;
  o.timeout_seconds = timeout;
  o.init_timeout_seconds = 5;
  o.context.task = "worker " + std::to_string(rank);
  return o;
}

mc::DeviceCall all_reduce(float* buf, std::size_t n, ReduceOp op = ReduceOp::kSum) {
  return {mc::DeviceCollective::kAllReduce, buf, buf, n, DataType::kFloat32, op, 0};
}

// Runs body(rank, backend) on `world` threads, each with its own backend over the fake. The body
// asserts with expect() (no Catch2 assertion in a thread: support/thread_expect.h); returns per
// rank what the rank's thread threw (its what(), "" when it returned), for the main thread to
// check.
template <typename Body>
std::vector<std::string> run_threads(int world, double timeout, Body body) {
  mc::NcclUniqueId id;
  fake_nccl_api().get_unique_id(&id);
  std::vector<std::string> failures(static_cast<std::size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        mc::NcclBackend backend(fake_nccl_api(), id, options_for(r, world, timeout));
        body(r, backend);
      } catch (const std::exception& e) {
        failures[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return failures;
}

}  // namespace

TEST_CASE("nccl backend over the fake: init in progress, all-reduce, mean and bucket complete",
          "[unit][nccl]") {
  FakeNcclWorld::get().reset();
  FakeNcclWorld::get().init_polls = 5;  // the non-blocking init reports in-progress first
  constexpr int kWorld = 4;
  std::vector<std::vector<float>> results(kWorld);
  const auto errors = run_threads(kWorld, 5, [&](int r, mc::NcclBackend& backend) {
    std::vector<float> a(7, static_cast<float>(r + 1));
    mc::DeviceCall c = all_reduce(a.data(), a.size());
    backend.launch(&c, 1, nullptr)->wait();
    std::vector<float> m(3, static_cast<float>(2 * r));
    mc::DeviceCall mean = all_reduce(m.data(), m.size(), ReduceOp::kMean);
    backend.launch(&mean, 1, nullptr)->wait();
    std::vector<float> b1(2, 1.0f), b2(5, static_cast<float>(r));
    mc::DeviceCall bucket[] = {all_reduce(b1.data(), 2), all_reduce(b2.data(), 5)};
    auto work = backend.launch(bucket, 2, nullptr);
    work->wait();
    expect(work->test(), "work->test() after wait()");
    results[r] = {a[0], a[6], m[0], b1[1], b2[4]};
    expect(backend.seq() == 3, "backend.seq() == 3, not " + std::to_string(backend.seq()));
  });
  for (int r = 0; r < kWorld; ++r) {
    INFO("rank " << r << ": " << errors[r]);
    CHECK(errors[r].empty());
    // 1+2+3+4 = 10; mean of 0,2,4,6 = 3; bucket: 4 ones, 0+1+2+3 = 6.
    CHECK(results[r] == std::vector<float>{10, 10, 3, 4, 6});
  }
  CHECK(FakeNcclWorld::get().groups == kWorld);     // one group per rank for the bucket
  CHECK(FakeNcclWorld::get().divisions == kWorld);  // the mean's division, once per rank
  CHECK(FakeNcclWorld::get().destroys == kWorld);   // finalized and destroyed, not aborted
  CHECK(FakeNcclWorld::get().aborts == 0);
}

TEST_CASE("nccl backend: a rank that never calls makes every other rank time out and abort",
          "[unit][nccl][fault]") {
  FakeNcclWorld::get().reset();
  constexpr int kWorld = 4, kDead = 2;
  std::vector<std::string> errors(kWorld), later(kWorld);
  std::vector<double> seconds(kWorld);
  // char, not bool: std::vector<bool> packs its elements into shared bytes, so the rank threads'
  // writes to their own elements would race.
  std::vector<char> short_wait_timed_out(kWorld, 0);
  const auto failures = run_threads(kWorld, 0.3, [&](int r, mc::NcclBackend& backend) {
    if (r == kDead) {
      std::this_thread::sleep_for(std::chrono::milliseconds(800));  // alive, never calls
      return;
    }
    std::vector<float> a(4, 1.0f);
    mc::DeviceCall c = all_reduce(a.data(), a.size());
    auto work = backend.launch(&c, 1, nullptr);
    expect(!work->test(), "!work->test() at launch");  // in progress: the event is pending
    // A wait shorter than the collective's deadline times out without aborting anything.
    try {
      work->wait(0.05);
    } catch (const mwms::TimeoutError&) {
      short_wait_timed_out[r] = 1;
    }
    const auto start = std::chrono::steady_clock::now();
    try {
      work->wait();
    } catch (const mwms::TimeoutError& e) {
      errors[r] = e.what();
      expect(e.context().rank == r, "context rank " + std::to_string(r) + ", not " +
                                        std::to_string(e.context().rank));
      expect(e.context().op == "all_reduce", "context op all_reduce, not " + e.context().op);
      expect(e.context().seq == 0, "context seq 0, not " + std::to_string(e.context().seq));
    }
    seconds[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    expect(work->test(), "work->test() after the timeout");  // completed, with the error
    try {
      backend.launch(&c, 1, nullptr);
    } catch (const mwms::InvalidUsage& e) {
      later[r] = e.what();
    }
  });
  for (int r = 0; r < kWorld; ++r) {
    INFO("rank " << r << ": " << failures[r]);
    CHECK(failures[r].empty());
    if (r == kDead) continue;
    INFO("rank " << r << ": " << errors[r]);
    CHECK(short_wait_timed_out[r] == 1);
    CHECK(errors[r].find("did not complete within 0.3 s") != std::string::npos);
    CHECK(errors[r].find("aborted") != std::string::npos);
    CHECK(seconds[r] < 2.0);
    CHECK(later[r].find("poisoned") != std::string::npos);
    CHECK(later[r].find("did not complete") != std::string::npos);
    CHECK(FakeNcclWorld::get().comm_of_rank(r)->aborted);
  }
  // Every live rank aborted its communicator; the dead one was finalized normally.
  CHECK(FakeNcclWorld::get().aborts == kWorld - 1);
  CHECK(FakeNcclWorld::get().destroys == 1);
}

TEST_CASE("nccl backend: an init that never completes times out and aborts", "[unit][nccl][fault]") {
  FakeNcclWorld::get().reset();
  FakeNcclWorld::get().init_never_completes = true;
  mc::NcclUniqueId id;
  mc::NcclBackendOptions o = options_for(0, 2);
  o.init_timeout_seconds = 0.2;
  try {
    mc::NcclBackend backend(fake_nccl_api(), id, o);
    FAIL("init completed");
  } catch (const mwms::TimeoutError& e) {
    CHECK(std::string(e.what()).find("ncclCommInitRankConfig still in progress after 0.2 s") !=
          std::string::npos);
    CHECK(e.context().op == "nccl init");
  }
  CHECK(FakeNcclWorld::get().aborts == 1);
}

TEST_CASE("nccl backend: an asynchronous NCCL error becomes a PeerError and aborts",
          "[unit][nccl][fault]") {
  FakeNcclWorld::get().reset();
  mc::NcclUniqueId id;
  mc::NcclBackend backend(fake_nccl_api(), id, options_for(0, 2));  // rank 1 never comes
  std::vector<float> a(4, 1.0f);
  mc::DeviceCall c = all_reduce(a.data(), a.size());
  auto work = backend.launch(&c, 1, nullptr);
  FakeNcclWorld::get().comm_of_rank(0)->async_error = mc::kNcclRemoteError;
  try {
    work->wait();
    FAIL("no error");
  } catch (const mwms::PeerError& e) {
    const std::string what = e.what();
    CHECK(what.find("NCCL error 6 (fake remote process exited") != std::string::npos);
    CHECK(what.find("fake: last error text") != std::string::npos);
    CHECK(e.context().transport == "nccl");
  }
  CHECK(FakeNcclWorld::get().aborts == 1);
  CHECK_THROWS_AS(backend.launch(&c, 1, nullptr), mwms::InvalidUsage);
}

TEST_CASE("nccl backend: NCCL and CUDA codes become BackendError with code and text",
          "[unit][nccl]") {
  FakeNcclWorld::get().reset();
  mc::NcclUniqueId id;
  FakeNcclWorld::get().init_polls = 0;
  mc::NcclBackend backend(fake_nccl_api(), id, options_for(0, 1));
  std::vector<float> a(4, 1.0f);
  mc::DeviceCall c = all_reduce(a.data(), a.size());
  // ncclInvalidArgument: a caller bug, the communicator stays usable.
  FakeNcclWorld::get().fail("all_reduce", mc::kNcclInvalidArgument);
  try {
    backend.launch(&c, 1, nullptr);
    FAIL("no error");
  } catch (const mwms::BackendError& e) {
    CHECK(e.native_code() == mc::kNcclInvalidArgument);
    CHECK(std::string(e.what()).find("nccl all_reduce failed: NCCL error 4 (fake invalid "
                                     "argument): fake: last error text") != std::string::npos);
  }
  FakeNcclWorld::get().clear("all_reduce");
  backend.launch(&c, 1, nullptr)->wait();
  CHECK(a[0] == 1.0f);  // world of one
  // A CUDA failure: BackendError with the cudaError_t; it poisons the communicator.
  FakeNcclWorld::get().fail("event_create", 2);
  try {
    backend.launch(&c, 1, nullptr);
    FAIL("no error");
  } catch (const mwms::BackendError& e) {
    CHECK(e.native_code() == 2);
    CHECK(std::string(e.what()).find("cudaEventCreate failed: CUDA error 2 (fake "
                                     "cudaErrorMemoryAllocation: out of memory)") !=
          std::string::npos);
  }
  CHECK_THROWS_AS(backend.launch(&c, 1, nullptr), mwms::InvalidUsage);
  // The mapping itself: remote and system errors are a peer's failure.
  mwms::ErrorContext ctx;
  ctx.rank = 3;
  auto classify = [&](int code) {
    try {
      std::rethrow_exception(mc::to_error(fake_nccl_api(), mc::NativeSource::kNccl, code, "x",
                                          nullptr, ctx));
    } catch (const mwms::PeerError&) {
      return std::string("peer");
    } catch (const mwms::BackendError& e) {
      return "backend " + std::to_string(e.native_code());
    }
  };
  CHECK(classify(mc::kNcclRemoteError) == "peer");
  CHECK(classify(mc::kNcclSystemError) == "peer");
  CHECK(classify(mc::kNcclInternalError) == "backend 3");
  CHECK(classify(mc::kNcclUnhandledCudaError) == "backend 1");
}

TEST_CASE("nccl backend: argument checks and the unique id's hex form", "[unit][nccl]") {
  FakeNcclWorld::get().reset();
  FakeNcclWorld::get().init_polls = 0;
  mc::NcclUniqueId id;
  mc::NcclBackend backend(fake_nccl_api(), id, options_for(0, 2));
  float x = 0;
  mc::DeviceCall bad_root{mc::DeviceCollective::kBroadcast, &x, &x, 1, DataType::kFloat32,
                          ReduceOp::kSum, 2};
  CHECK_THROWS_AS(backend.launch(&bad_root, 1, nullptr), mwms::InvalidArgument);
  mc::DeviceCall null_buffer = all_reduce(nullptr, 3);
  CHECK_THROWS_AS(backend.launch(&null_buffer, 1, nullptr), mwms::InvalidArgument);
  CHECK(backend.seq() == 0);
  for (std::size_t i = 0; i < id.bytes.size(); ++i) id.bytes[i] = static_cast<unsigned char>(i * 7);
  mc::NcclUniqueId back;
  REQUIRE(mc::from_hex(mc::to_hex(id), &back));
  CHECK(back.bytes == id.bytes);
  CHECK_FALSE(mc::from_hex("abc", &back));
  CHECK_FALSE(mc::from_hex(std::string(256, 'g'), &back));
}

TEST_CASE("nccl unique id: one message carries rank 0's status and id", "[unit][nccl]") {
  FakeNcclWorld::get().reset();
  mwms::ErrorContext ctx;
  ctx.task = "worker 1";
  const mc::UniqueIdMessage made = mc::make_unique_id_message(fake_nccl_api());
  CHECK(made.words[0] == mc::kNcclSuccess);
  mc::UniqueIdMessage carried;
  REQUIRE(mc::from_hex(mc::to_hex(made), &carried));  // the rendezvous' carrier
  const mc::NcclUniqueId id = mc::read_unique_id_message(fake_nccl_api(), carried, false,
                                                        "rank 0", ctx);
  CHECK(id.bytes == FakeNcclWorld::get().made_id.bytes);
  // Outside input: only exactly 264 lower-case hex digits.
  CHECK_FALSE(mc::from_hex(mc::to_hex(made).substr(2), &carried));
  CHECK_FALSE(mc::from_hex(mc::to_hex(id), &carried));
  CHECK_FALSE(mc::from_hex(std::string(264, 'G'), &carried));
  // A failing ncclGetUniqueId travels as its code and fails the reader, naming the leader.
  FakeNcclWorld::get().fail("get_unique_id", mc::kNcclInvalidUsage);
  const mc::UniqueIdMessage failed = mc::make_unique_id_message(fake_nccl_api());
  CHECK(failed.words[0] == mc::kNcclInvalidUsage);
  REQUIRE(mc::from_hex(mc::to_hex(failed), &carried));
  try {
    mc::read_unique_id_message(fake_nccl_api(), carried, false, "rank 0", ctx);
    FAIL("a failed ncclGetUniqueId was read as an id");
  } catch (const mwms::BackendError& e) {
    CHECK_THAT(e.what(), Catch::Contains("ncclGetUniqueId (rank 0)"));
    CHECK(e.context().task == "worker 1");
  }
}

TEST_CASE("DeviceCommunicator without NCCL in the build says so", "[unit][nccl]") {
  mwms::ResolvedCluster alone;
  mwms::CommunicatorOptions nccl;
  nccl.implementation = mwms::Implementation::kNccl;
  CHECK_THROWS_AS(mc::create_device_communicator(alone, nccl, nullptr, nullptr),
                  mwms::InvalidUsage);
  CHECK_THROWS_AS(mc::create_device_communicator(alone, {}, nullptr, nullptr), mwms::InvalidUsage);
  mwms::CommunicatorOptions ring;
  ring.implementation = mwms::Implementation::kRing;
  CHECK_THROWS_AS(mc::create_device_communicator(alone, ring, nullptr, nullptr),
                  mwms::InvalidUsage);
}

TEST_CASE("Communicator with Implementation::kNccl points to DeviceCommunicator", "[unit][nccl]") {
  mwms::ResolvedCluster alone;
  mwms::CommunicatorOptions o;
  o.implementation = mwms::Implementation::kNccl;
  try {
    mwms::Communicator::create(alone, o);
    FAIL("created");
  } catch (const mwms::InvalidArgument& e) {
    CHECK(std::string(e.what()).find("create a DeviceCommunicator") != std::string::npos);
  }
}

TEST_CASE("nccl backend: barrier waits for every rank, finalize destroys the communicator once",
          "[unit][nccl]") {
  FakeNcclWorld::get().reset();
  constexpr int kWorld = 3, kLate = 2;
  std::atomic<int> arrived{0};
  std::vector<std::string> after(kWorld);
  const auto failures = run_threads(kWorld, 5, [&](int r, mc::NcclBackend& backend) {
    if (r == kLate) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    ++arrived;
    backend.barrier(nullptr);
    // Note [nccl barrier]: it completes only once every rank enqueued it.
    expect(arrived == kWorld, "every rank arrived before a barrier returned, not " +
                                  std::to_string(arrived.load()));
    backend.barrier(nullptr);  // the scratch buffer is reused
    std::vector<float> a(5, static_cast<float>(r + 1));
    mc::DeviceCall c = all_reduce(a.data(), a.size());
    backend.launch(&c, 1, nullptr)->wait();
    expect(a[4] == 6.0f, "sum 6 after the barriers, not " + std::to_string(a[4]));
    backend.finalize();
    backend.finalize();  // a second call does nothing
    try {
      backend.launch(&c, 1, nullptr);
    } catch (const mwms::InvalidUsage& e) {
      after[r] = e.what();
    }
    try {
      backend.barrier(nullptr);
      after[r] += "; barrier accepted";
    } catch (const mwms::InvalidUsage&) {
      after[r] += "; barrier refused";
    }
  });
  for (int r = 0; r < kWorld; ++r) {
    INFO("rank " << r << ": " << failures[r] << " / " << after[r]);
    CHECK(failures[r].empty());
    CHECK(after[r].find("the NCCL communicator was finalized") != std::string::npos);
    CHECK(after[r].find("; barrier refused") != std::string::npos);
  }
  // One finalize and one destroy per rank (the destructors did not repeat them), no abort, and
  // every barrier buffer freed.
  CHECK(FakeNcclWorld::get().finalizes == kWorld);
  CHECK(FakeNcclWorld::get().destroys == kWorld);
  CHECK(FakeNcclWorld::get().aborts == 0);
  CHECK(FakeNcclWorld::get().device_allocations == 0);
}

TEST_CASE("nccl backend: barrier and finalize faults: a missing rank, a stuck finalize, no scratch memory",
          "[unit][nccl][fault]") {
  SECTION("a missing rank: every barrier is a TimeoutError, then the backend is poisoned") {
    FakeNcclWorld::get().reset();
    std::vector<std::string> errors(2);
    const auto failures = run_threads(2, 0.3, [&](int r, mc::NcclBackend& backend) {
      if (r == 1) {
        std::this_thread::sleep_for(std::chrono::milliseconds(600));  // alive, never enters
        return;
      }
      try {
        backend.barrier(nullptr);
      } catch (const mwms::TimeoutError& e) {
        errors[r] = e.what();
        expect(e.context().op == "barrier", "context op barrier, not " + e.context().op);
      }
      try {
        backend.finalize();
      } catch (const mwms::InvalidUsage& e) {
        errors[r] += std::string(" / finalize: ") + e.what();
      }
    });
    INFO(failures[0] << failures[1] << " / " << errors[0]);
    CHECK(failures[0].empty());
    CHECK(errors[0].find("nccl barrier seq 0 did not complete within 0.3 s") != std::string::npos);
    CHECK(errors[0].find(" / finalize: the NCCL communicator is poisoned") != std::string::npos);
    CHECK(FakeNcclWorld::get().comm_of_rank(0)->aborted);
    CHECK(FakeNcclWorld::get().device_allocations == 0);
  }
  SECTION("a finalize that never completes: TimeoutError, aborted, not destroyed") {
    FakeNcclWorld::get().reset();
    FakeNcclWorld::get().finalize_polls = 1 << 30;
    mc::NcclUniqueId id;
    {
      mc::NcclBackend backend(fake_nccl_api(), id, options_for(0, 1, 0.2));
      try {
        backend.finalize();
        FAIL("finalize completed");
      } catch (const mwms::TimeoutError& e) {
        CHECK(std::string(e.what()).find("ncclCommFinalize did not complete within 0.2 s") !=
              std::string::npos);
        CHECK(e.context().op == "finalize");
      }
      std::vector<float> a(2, 1.0f);
      mc::DeviceCall c = all_reduce(a.data(), a.size());
      CHECK_THROWS_AS(backend.launch(&c, 1, nullptr), mwms::InvalidUsage);
    }
    CHECK(FakeNcclWorld::get().aborts == 1);
    CHECK(FakeNcclWorld::get().destroys == 0);
  }
  SECTION("cudaMalloc of the barrier's buffer fails: a BackendError, nothing poisoned") {
    FakeNcclWorld::get().reset();
    mc::NcclUniqueId id;
    mc::NcclBackend backend(fake_nccl_api(), id, options_for(0, 1));
    FakeNcclWorld::get().fail("malloc_device", 2);
    try {
      backend.barrier(nullptr);
      FAIL("barrier without its buffer");
    } catch (const mwms::BackendError& e) {
      CHECK(e.native_code() == 2);
      CHECK(std::string(e.what()).find("cudaMalloc (the barrier's 4 bytes) failed: CUDA error 2") !=
            std::string::npos);
    }
    FakeNcclWorld::get().fail("", 0);
    backend.barrier(nullptr);  // world of one: completes at once
    backend.finalize();
    CHECK(FakeNcclWorld::get().aborts == 0);
  }
}
