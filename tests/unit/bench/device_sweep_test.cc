// The --backend nccl sweep and bucket_perf's device path (bench/common/device_sweep.cc) without a
// GPU: host memory behind the device::Runtime table and a one-rank fake DeviceCommunicator that
// records what the bench asked for. Checks that the first call's result is copied back and
// verified (a corrupted element is counted and makes the status 1), that raw NCCL is created once
// and timed with warm-ups and iterations on the same buffer, the nccl columns and JSON, and the
// bucket path's calls (one all_reduce_bucket of every tensor per iteration against one
// all_reduce per tensor).
#include "common/device_sweep.h"

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common/gradients.h"
#include "common/verification.h"
#include "mwms/errors.h"

namespace {

namespace dev = mwms::bench::device;
using mwms::DataType;
using mwms::DeviceStream;
using mwms::DeviceTensor;
using mwms::ReduceOp;
using mwms::Work;

class DoneWork final : public Work {
 public:
  bool test() noexcept override { return true; }
  void wait(std::optional<double>) override {}
};

// One rank: every collective leaves its in-place buffer as it is, which is the right result;
// `corrupt` makes the next call on more than 16 elements (a checked row, not the bench's own
// barrier or reductions) change its last element, as a broken backend would.
class FakeComm final : public mwms::DeviceCommunicator {
 public:
  int rank() const noexcept override { return 0; }
  int world_size() const noexcept override { return 1; }
  int device() const noexcept override { return 0; }

  std::shared_ptr<Work> all_reduce_async(void* buffer, std::size_t count, DataType dtype, ReduceOp,
                                         DeviceStream stream) override {
    CHECK(stream.handle == expected_stream);
    ++all_reduces;
    maybe_corrupt(buffer, count, dtype);
    return std::make_shared<DoneWork>();
  }
  std::shared_ptr<Work> all_reduce_bucket_async(const DeviceTensor* tensors, std::size_t n,
                                                DataType, ReduceOp, DeviceStream) override {
    bucket_sizes.push_back(n);
    CHECK(tensors != nullptr);
    return std::make_shared<DoneWork>();
  }
  std::shared_ptr<Work> reduce_scatter_async(const void* send, void* recv, std::size_t, DataType,
                                             ReduceOp, DeviceStream) override {
    CHECK(send == recv);  // rank 0's block starts the buffer
    return std::make_shared<DoneWork>();
  }
  std::shared_ptr<Work> all_gather_async(const void* send, void* recv, std::size_t count,
                                         DataType dtype, DeviceStream) override {
    CHECK(send == recv);
    maybe_corrupt(recv, count, dtype);
    return std::make_shared<DoneWork>();
  }
  std::shared_ptr<Work> broadcast_async(void*, std::size_t, DataType, int root,
                                        DeviceStream) override {
    CHECK(root == 0);
    return std::make_shared<DoneWork>();
  }
  void barrier(DeviceStream) override {}
  void finalize() override {}
  std::string describe() const override { return "fake nccl (device 0, world size 1)"; }
  void abort(const std::string&) noexcept override {}

  void* expected_stream = nullptr;
  int corrupt = 0;
  int all_reduces = 0;
  std::vector<std::size_t> bucket_sizes;

 private:
  void maybe_corrupt(void* buffer, std::size_t count, DataType dtype) {
    if (corrupt == 0 || count <= 16) return;
    --corrupt;
    mwms::bench::store_element(buffer, count - 1, dtype, 99);
  }
};

// The fake runtime's record of raw NCCL and the stream.
struct Record {
  int streams = 0;
  int raw_creates = 0;
  int raw_destroys = 0;
  int raw_waits = 0;
  std::vector<std::size_t> raw_counts;  // count of each raw collective
  std::vector<void*> raw_buffers;
  int live_allocations = 0;
};
Record record;
int stream_token = 0;

dev::Runtime fake_runtime() {
  dev::Runtime rt;
  rt.alloc = [](std::size_t bytes) -> void* {
    ++record.live_allocations;
    return std::calloc(bytes, 1);
  };
  rt.release = [](void* p) noexcept {
    --record.live_allocations;
    std::free(p);
  };
  rt.stream_create = []() -> void* {
    ++record.streams;
    return &stream_token;
  };
  rt.stream_destroy = [](void*) noexcept {};
  rt.to_device = [](void* dst, const void* src, std::size_t bytes, void* stream) {
    CHECK(stream == &stream_token);
    std::memcpy(dst, src, bytes);
  };
  rt.to_host = [](void* dst, const void* src, std::size_t bytes, void* stream) {
    CHECK(stream == &stream_token);
    std::memcpy(dst, src, bytes);
  };
  rt.raw_create = [](mwms::DeviceCommunicator&, void*) -> void* {
    ++record.raw_creates;
    return &record;
  };
  rt.raw_destroy = [](void* raw) noexcept {
    CHECK(raw == &record);
    ++record.raw_destroys;
  };
  rt.raw_enqueue = [](void*, mwms::bench::DeviceCollective, void* buffer,
                      const mwms::bench::CallShape& s, DataType, void*) {
    record.raw_counts.push_back(s.count);
    record.raw_buffers.push_back(buffer);
  };
  rt.raw_wait = [](void*, void*) { ++record.raw_waits; };
  rt.library = [] { return std::string("NCCL fake"); };
  return rt;
}

// The all-reduce descriptor as bench/all_reduce.cc has it (that file also holds main()).
mwms::bench::CollectiveDescriptor all_reduce_descriptor() {
  mwms::bench::CollectiveDescriptor d{};
  d.name = "all_reduce";
  d.count_for_bytes = [](std::size_t bytes, std::size_t elem, int) { return bytes / elem; };
  d.buffer_count = [](std::size_t count, int) { return count; };
  d.busbw_factor = [](int n) { return 2.0 * (n - 1) / n; };
  d.input_value = [](std::size_t i, const mwms::bench::CallShape& s) {
    return mwms::bench::reduction_input(i, s.rank, s.world_size, s.op);
  };
  d.expected_value = [](std::size_t i, const mwms::bench::CallShape& s) {
    return mwms::bench::reduction_expected(i, s.world_size, s.op);
  };
  d.checked_range = [](const mwms::bench::CallShape& s) {
    return std::pair<std::size_t, std::size_t>{0, s.count};
  };
  d.timing_value = [](ReduceOp op) { return op == ReduceOp::kProd ? 1.0 : 0.0; };
  d.uses_op = true;
  d.device = mwms::bench::DeviceCollective::kAllReduce;
  return d;
}

mwms::bench::BenchOptions sweep_options() {
  mwms::bench::BenchOptions o;
  o.backend = "nccl";
  o.compare_nccl = true;
  o.min_bytes = 8;
  o.max_bytes = 4096;
  o.step_factor = 8;  // 8, 64, 512, 4096 B: 4 rows
  o.iters = 3;
  o.warmup_iters = 2;
  return o;
}

// Runs the sweep with std::cout captured.
int run_sweep(FakeComm& comm, const mwms::bench::BenchOptions& o, std::string* out) {
  std::ostringstream captured;
  std::streambuf* old = std::cout.rdbuf(captured.rdbuf());
  int status = -1;
  try {
    status = dev::sweep(all_reduce_descriptor(), o, comm, fake_runtime());
  } catch (...) {
    std::cout.rdbuf(old);
    throw;
  }
  std::cout.rdbuf(old);
  *out = captured.str();
  return status;
}

}  // namespace

TEST_CASE("device sweep: checked rows and raw NCCL timed on the same buffer with nccl columns",
          "[unit][bench]") {
  record = Record{};
  FakeComm comm;
  comm.expected_stream = &stream_token;
  auto o = sweep_options();
  o.json_path = "device_sweep_test.json";
  std::string out;
  REQUIRE(run_sweep(comm, o, &out) == 0);
  INFO(out);
  CHECK(out.find("# Backend: nccl requested; used: fake nccl (device 0, world size 1)") !=
        std::string::npos);
  CHECK(out.find("# NCCL: NCCL fake") != std::string::npos);
  CHECK(out.find("nccl time") != std::string::npos);
  CHECK(out.find("#  Rank 0 device 0") != std::string::npos);
  CHECK(out.find("# Out of bounds values : 0 OK") != std::string::npos);
  CHECK(out.find("# Median vs NCCL 16M+  : n/a") != std::string::npos);
  // One raw communicator; per row warm-ups + iterations, all on the one device buffer.
  CHECK(record.raw_creates == 1);
  CHECK(record.raw_destroys == 1);
  REQUIRE(record.raw_counts.size() == 4u * (2 + 3));
  CHECK(record.raw_counts.front() == 2);    // 8 B of float32
  CHECK(record.raw_counts.back() == 1024);  // 4 KiB
  for (void* b : record.raw_buffers) CHECK(b == record.raw_buffers.front());
  CHECK(record.raw_waits == 2 * 4);  // after the warm-ups and after the timed calls, per row
  CHECK(record.live_allocations == 0);
  CHECK(record.streams == 1);
  // Ours per row: the checked call, one warm-up less (the check is the first), the iterations,
  // plus the bench's barriers and its reductions over ranks (times, wrong counts).
  CHECK(comm.all_reduces == 4 * (1 + 1 + 3) + 4 * 2 /*barriers*/ + 4 * 2 /*reductions*/);
  std::ifstream in(o.json_path);
  const auto j = nlohmann::json::parse(in);
  std::remove(o.json_path.c_str());
  REQUIRE(j.size() == 5);
  CHECK(j[0]["size"] == 8);
  CHECK(j[0]["wrong"] == 0);
  CHECK(j[0].contains("nccl_time_us"));
  CHECK(j[4]["backend"] == "nccl");
  CHECK(j[4]["nccl_library"] == "NCCL fake");
  CHECK(j[4]["describe"] == "fake nccl (device 0, world size 1)");
}

TEST_CASE("device sweep: a wrong element copied back is counted and fails the run",
          "[unit][bench]") {
  record = Record{};
  FakeComm comm;
  comm.expected_stream = &stream_token;
  comm.corrupt = 1;  // the checked call of the first row of more than 16 elements (512 B)
  auto o = sweep_options();
  o.compare_nccl = false;
  o.min_bytes = 64;
  std::string out;
  CHECK(run_sweep(comm, o, &out) == 1);
  INFO(out);
  CHECK(out.find("# Out of bounds values : 1 FAILED") != std::string::npos);
  CHECK(out.find("nccl time") == std::string::npos);
  CHECK(record.raw_creates == 0);
  CHECK(record.live_allocations == 0);
}

TEST_CASE("device sweep: --root beyond the world is refused before any collective",
          "[unit][bench]") {
  record = Record{};
  FakeComm comm;
  comm.expected_stream = &stream_token;
  auto d = all_reduce_descriptor();
  d.uses_root = true;
  d.device = mwms::bench::DeviceCollective::kBroadcast;
  auto o = sweep_options();
  o.root = 1;
  CHECK_THROWS_AS(dev::sweep(d, o, comm, fake_runtime()), mwms::InvalidArgument);
  CHECK(comm.all_reduces == 0);
  CHECK(record.live_allocations == 0);
}

TEST_CASE("device buckets: one all_reduce_bucket of every tensor against one call per tensor",
          "[unit][bench]") {
  record = Record{};
  FakeComm comm;
  comm.expected_stream = &stream_token;
  mwms::bench::BucketOptions o;
  o.backend = "nccl";
  o.tensors = 20;
  o.total_bytes = 64 << 10;
  o.iters = 4;
  o.warmup_iters = 1;
  const auto counts = mwms::bench::model_like_counts(o.tensors, o.total_bytes, 4);
  mwms::bench::BucketRunInfo info;
  const auto row = dev::buckets(counts, o, comm, fake_runtime(), &info);
  CHECK(row.tensors == 20);
  CHECK(row.bytes == std::size_t{64} << 10);
  CHECK(row.buckets == 1);
  CHECK(row.wrong == 0);
  CHECK(row.bucketed_time_us > 0);
  CHECK(row.separate_time_us > 0);
  // The check, the warm-up and the iterations, each a bucket of all 20 tensors.
  CHECK(comm.bucket_sizes == std::vector<std::size_t>(1 + 1 + 4, 20));
  // 20 all-reduces per check/warm-up/iteration, plus one barrier per path and two reductions.
  CHECK(comm.all_reduces == 20 * (1 + 1 + 4) + 2 + 2);
  CHECK(info.buffers == "device");
  CHECK(info.backend == "nccl");
  CHECK(record.live_allocations == 0);

  comm.corrupt = 1;  // the separate path's checked call on a tensor of more than 16 elements
  const auto bad = dev::buckets(counts, o, comm, fake_runtime(), &info);
  CHECK(bad.wrong == 1);
}
