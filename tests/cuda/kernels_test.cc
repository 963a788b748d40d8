// gpu:kernels — the CUDA kernels (kernels/cuda/cuda_kernels.h) against the CPU kernels on a
// device, bit for bit: reduce for every dtype x op on edge values and every 16-bit pattern, the
// mean's division, float32 <-> float16/bfloat16 casts, pack/unpack, and the Reducer choosing the
// device path by buffer location. Skipped (exit 77) without a device (gpu_main.cc).
#include <cuda_runtime.h>

#include <catch2/catch.hpp>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/reduce.h"
#include "kernels/reducer.h"
#include "support/element_cases.h"

namespace {

using mwms::DataType;
using mwms::ReduceOp;
using mwms::testing::BitBuffer;
using mwms::testing::NanMatch;
namespace mk = mwms::kernels;
namespace cu = mwms::kernels::cuda;

// Device copy of a host buffer, freed on scope exit.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
    cu::check(cudaMalloc(&ptr_, bytes ? bytes : 1), "cudaMalloc");
  }
  DeviceBuffer(const void* host, std::size_t bytes) : DeviceBuffer(bytes) { upload(host); }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }
  void upload(const void* host) { cu::check(cudaMemcpy(ptr_, host, bytes_, cudaMemcpyHostToDevice), "cudaMemcpy"); }
  void download(void* host) const {
    cu::check(cudaMemcpy(host, ptr_, bytes_, cudaMemcpyDeviceToHost), "cudaMemcpy");
  }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_;
};

}  // namespace

TEST_CASE("CUDA reduce equals kernels::reduce bit for bit on every dtype x op", "[cuda]") {
  mwms::testing::for_each_reduce_case([](const mwms::testing::ReduceCase& c) {
    const DataType dt = c.dtype;
    const ReduceOp op = c.op;
    INFO(std::string(mwms::to_string(dt)) + " " + std::string(mwms::to_string(op)));
    BitBuffer got = c.a;
    DeviceBuffer da(c.a.data(), c.a.bytes()), db(c.b.data(), c.b.bytes());
    cu::check(cu::reduce(da.get(), db.get(), c.a.count(), dt, op, nullptr), "reduce");
    cu::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    da.download(got.data());
    // The GPU's one canonical NaN (Note [device NaN bits]): NaN results need not keep the bits.
    CHECK(mwms::testing::count_mismatches(op, c.a, c.b, c.want, got, NanMatch::kAnyNan) == 0);
    // dst == src (in place), an odd count, a count of 0 (must not touch anything).
    BitBuffer self_want = c.a, self_got = c.a;
    mk::reduce(self_want.data(), self_want.data(), c.a.count() - 1, dt, op);
    DeviceBuffer ds(c.a.data(), c.a.bytes());
    cu::check(cu::reduce(ds.get(), ds.get(), c.a.count() - 1, dt, op, nullptr), "reduce in place");
    cu::check(cu::reduce(ds.get(), db.get(), 0, dt, op, nullptr), "reduce of 0");
    cu::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    ds.download(self_got.data());
    CHECK(mwms::testing::count_mismatches(op, c.a, c.a, self_want, self_got, NanMatch::kAnyNan) ==
          0);
  });
}

TEST_CASE("CUDA scale_divide equals kernels::scale_divide on every dtype", "[cuda]") {
  mwms::testing::for_each_scale_case({1, 3, 8, -1, 1000}, [](const mwms::testing::ScaleCase& c) {
    INFO(std::string(mwms::to_string(c.dtype)) + " / " + std::to_string(c.divisor));
    BitBuffer got = c.a;
    DeviceBuffer da(c.a.data(), c.a.bytes());
    cu::check(cu::scale_divide(da.get(), c.a.count(), c.dtype, c.divisor, nullptr),
              "scale_divide");
    cu::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    da.download(got.data());
    // Divisor 1 returns early (a signalling NaN stays one): exact bits; else a NaN divided is
    // the GPU's canonical NaN (Note [device NaN bits]).
    const ReduceOp compare = c.divisor == 1 ? ReduceOp::kMin : ReduceOp::kSum;
    CHECK(mwms::testing::count_mismatches(compare, c.a, c.a, c.want, got, NanMatch::kAnyNan) == 0);
  });
}

TEST_CASE("CUDA casts equal the CPU casts", "[cuda]") {
  BitBuffer f(DataType::kFloat32, 0), unused(DataType::kFloat32, 0);
  mwms::testing::operand_pairs(DataType::kFloat32, &f, &unused);
  const std::size_t n = f.count();
  DeviceBuffer d32(f.data(), f.bytes()), d16(n * 2), back(n * 4);
  for (DataType t : {DataType::kFloat16, DataType::kBFloat16}) {
    std::vector<std::uint16_t> want(n), got(n);
    std::vector<float> want32(n), got32(n);
    mk::float32_to_16(want.data(), static_cast<const float*>(f.data()), n, t);
    mk::float16_to_32(want32.data(), want.data(), n, t);
    cu::check(cu::float32_to_16(static_cast<std::uint16_t*>(d16.get()),
                                static_cast<const float*>(d32.get()), n, t, nullptr), "to 16");
    cu::check(cu::float16_to_32(static_cast<float*>(back.get()),
                                static_cast<const std::uint16_t*>(d16.get()), n, t, nullptr),
              "to 32");
    cu::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    d16.download(got.data());
    back.download(got32.data());
    CHECK(want == got);
    CHECK(std::memcmp(want32.data(), got32.data(), n * 4) == 0);
  }
}

TEST_CASE("CUDA pack and unpack move many tensors through one bucket", "[cuda]") {
  // 100 tensors (more than one launch's batch), sizes aligned and not, at packed offsets.
  std::vector<std::size_t> sizes;
  for (std::size_t i = 0; i < 100; ++i) sizes.push_back(i % 3 == 0 ? 16 * (i + 1) : 7 * i + 1);
  std::vector<std::vector<unsigned char>> host(sizes.size());
  std::vector<std::unique_ptr<DeviceBuffer>> dev;
  std::vector<cu::PackEntry> entries;
  std::size_t offset = 0;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    host[i].resize(sizes[i]);
    for (std::size_t j = 0; j < sizes[i]; ++j) host[i][j] = static_cast<unsigned char>(i * 31 + j);
    dev.push_back(std::make_unique<DeviceBuffer>(host[i].data(), sizes[i]));
    entries.push_back({dev.back()->get(), sizes[i], offset});
    offset += (sizes[i] + 15) / 16 * 16;
  }
  DeviceBuffer bucket(offset);
  cu::check(cudaMemset(bucket.get(), 0, offset), "cudaMemset");
  cu::check(cu::pack(bucket.get(), entries.data(), entries.size(), nullptr), "pack");
  std::vector<unsigned char> packed(offset);
  cu::check(cudaDeviceSynchronize(), "sync");
  bucket.download(packed.data());
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    wrong += std::memcmp(packed.data() + entries[i].offset, host[i].data(), sizes[i]) != 0;
  }
  CHECK(wrong == 0);
  for (auto& d : dev) cu::check(cudaMemset(d->get(), 0, 1), "cudaMemset");
  cu::check(cu::unpack(bucket.get(), entries.data(), entries.size(), nullptr), "unpack");
  cu::check(cudaDeviceSynchronize(), "sync");
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    std::vector<unsigned char> back(sizes[i]);
    dev[i]->download(back.data());
    wrong += back != host[i];
  }
  CHECK(wrong == 0);
}

TEST_CASE("Reducer picks the CUDA path for device buffers", "[cuda]") {
  std::vector<float> a = {1, 2, 3, 4}, b = {10, 20, 30, 40};
  DeviceBuffer da(a.data(), 16), db(b.data(), 16);
  CHECK(mk::Reducer::locate(da.get()) == mk::BufferLocation::kDevice);
  CHECK(mk::Reducer::locate(a.data()) == mk::BufferLocation::kHost);
  mk::Reducer reducer;
  reducer.reduce(da.get(), db.get(), 4, DataType::kFloat32, ReduceOp::kMax);
  reducer.scale_divide(da.get(), 4, DataType::kFloat32, 10);
  std::vector<float> got(4);
  da.download(got.data());
  CHECK(got == std::vector<float>{1, 2, 3, 4});
  CHECK_THROWS_AS(reducer.reduce(da.get(), b.data(), 4, DataType::kFloat32, ReduceOp::kSum),
                  mwms::InvalidArgument);
}
