// The element functors of kernels/element_ops.h (what the CUDA kernels apply) against the CPU
// kernels, bit for bit, on every dtype x op and every ISA variant of this CPU: edge values
// (NaN/Inf/subnormals/signed zeros/integer limits) and, for float16/bfloat16, every bit pattern.
// This is how the GPU's element logic is tested without a GPU (Note [gpu bit identity]).
#include "kernels/element_ops.h"

#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/reduce.h"
#include "kernels/reducer.h"
#include "support/element_cases.h"

namespace {

using mwms::DataType;
using mwms::ReduceOp;
using mwms::testing::BitBuffer;
namespace mk = mwms::kernels;
namespace ops = mwms::kernels::ops;

// dst[i] = f(dst[i], src[i]) with the functor of (dt, op), element by element (what a CUDA
// thread does).
void functor_reduce(BitBuffer* dst, const BitBuffer& src, ReduceOp op) {
  ops::with_reduce_functor(dst->dtype(), op, [&](auto f) {
    using T = typename decltype(f)::Storage;
    T* d = static_cast<T*>(dst->data());
    const T* s = static_cast<const T*>(src.data());
    for (std::size_t i = 0; i < dst->count(); ++i) d[i] = f(d[i], s[i]);
  });
}

// As the CUDA launcher does it.
void functor_scale(BitBuffer* buf, int divisor) {
  if (ops::scale_is_identity(divisor)) return;
  ops::with_scale_functor(buf->dtype(), divisor, [&](auto f) {
    using T = typename decltype(f)::Storage;
    T* p = static_cast<T*>(buf->data());
    for (std::size_t i = 0; i < buf->count(); ++i) p[i] = f(p[i]);
  });
}

struct ForcedIsa {
  explicit ForcedIsa(mk::detail::KernelIsa isa) { mk::detail::force_kernel_isa(isa); }
  ~ForcedIsa() { mk::detail::force_kernel_isa(std::nullopt); }
};

}  // namespace

TEST_CASE("element functors reduce bit for bit as kernels::reduce", "[unit][kernels]") {
  for (mk::detail::KernelIsa isa : mk::detail::kAllKernelIsas) {
    if (!mk::detail::kernel_isa_available(isa)) continue;
    ForcedIsa forced(isa);
    mwms::testing::for_each_reduce_case([&](const mwms::testing::ReduceCase& c) {
      INFO(std::string(mk::detail::to_string(isa)) + " " + std::string(mwms::to_string(c.dtype)) +
           " " + std::string(mwms::to_string(c.op)) + ", " + std::to_string(c.a.count()) +
           " pairs");
      BitBuffer got = c.a;
      functor_reduce(&got, c.b, c.op);
      CHECK(mwms::testing::count_mismatches(c.op, c.a, c.b, c.want, got) == 0);
    });
  }
}

TEST_CASE("element functors divide bit for bit as kernels::scale_divide", "[unit][kernels]") {
  mwms::testing::for_each_scale_case(
      {1, 2, 3, 7, 8, -1, -3, 1000}, [](const mwms::testing::ScaleCase& c) {
        INFO(std::string(mwms::to_string(c.dtype)) + " / " + std::to_string(c.divisor));
        BitBuffer got = c.a;
        functor_scale(&got, c.divisor);
        // A NaN divided keeps being a NaN; the payload is the FPU's (one operand): compare exactly.
        CHECK(mwms::testing::count_mismatches(ReduceOp::kMin, c.a, c.a, c.want, got) == 0);
      });
}

TEST_CASE("a device's reduce may give its canonical NaN where the CPU's sum or product is NaN, "
          "nothing else", "[unit][kernels]") {
  // What gpu:kernels allows (Note [device NaN bits]): the CPU's result with every NaN made the
  // GPU's canonical NaN passes for sum and prod (not with the CPU's bits required), not for
  // min/max; a NaN result that is not a NaN fails.
  auto canonical = [](DataType dt) -> std::uint64_t {
    switch (dt) {
      case DataType::kFloat32: return 0x7fffffffu;
      case DataType::kFloat64: return 0x7fffffffffffffffull;
      default: return 0x7fffu;  // float16, bfloat16: float_to_half/bfloat16 of 0x7fffffff
    }
  };
  using mwms::testing::NanMatch;
  std::size_t cases = 0;
  mwms::testing::for_each_reduce_case([&](const mwms::testing::ReduceCase& c) {
    if (c.dtype == DataType::kInt32 || c.dtype == DataType::kInt64) return;
    INFO(std::string(mwms::to_string(c.dtype)) + " " + std::string(mwms::to_string(c.op)));
    BitBuffer device = c.want;
    std::size_t nans = 0;
    for (std::size_t i = 0; i < device.count(); ++i) {
      if (!mwms::testing::is_nan_bits(c.dtype, device.get(i))) continue;
      nans += device.get(i) != canonical(c.dtype);
      device.set(i, canonical(c.dtype));
    }
    REQUIRE(nans > 0);  // the edge values give NaNs with other bits
    const bool arithmetic = c.op != ReduceOp::kMin && c.op != ReduceOp::kMax;
    const std::size_t any = mwms::testing::count_mismatches(c.op, c.a, c.b, c.want, device,
                                                            NanMatch::kAnyNan);
    CHECK((arithmetic ? any == 0 : any > 0));
    CHECK(mwms::testing::count_mismatches(c.op, c.a, c.b, c.want, device) > 0);
    if (arithmetic) {
      for (std::size_t i = 0; i < device.count(); ++i) {
        if (mwms::testing::is_nan_bits(c.dtype, device.get(i))) {
          device.set(i, 0);  // +0: a NaN lost
          break;
        }
      }
      CHECK(mwms::testing::count_mismatches(c.op, c.a, c.b, c.want, device, NanMatch::kAnyNan) ==
            1);
    }
    ++cases;
  });
  CHECK(cases == 4 * 5);
}

TEST_CASE("element conversions equal the CPU's on every 16-bit pattern and float edges",
          "[unit][kernels]") {
  std::size_t wrong = 0;
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const auto x = static_cast<std::uint16_t>(h);
    const float hf = ops::half_to_float(x), bf = ops::bfloat16_to_float(x);
    wrong += ops::bits_of(hf) != ops::bits_of(mk::half_to_float(x));
    wrong += ops::bits_of(bf) != ops::bits_of(mk::bfloat16_to_float(x));
  }
  // float32 -> 16 bits: a stride through all 2^32 patterns plus every pattern near the rounding
  // boundaries of the half range.
  auto check_float = [&](std::uint32_t u) {
    const float f = ops::float_of(u);
    wrong += ops::float_to_half(f) != mk::float_to_half(f);
    wrong += ops::float_to_bfloat16(f) != mk::float_to_bfloat16(f);
  };
  for (std::uint64_t u = 0; u < (1ull << 32); u += 4099) check_float(static_cast<std::uint32_t>(u));
  for (std::uint32_t base : {0x33000000u, 0x38800000u, 0x477fe000u, 0x7f800000u}) {
    for (std::uint32_t d = 0; d < 70000; ++d) {
      check_float(base - 35000 + d);
      check_float((base - 35000 + d) | 0x80000000u);
    }
  }
  CHECK(wrong == 0);
  // The array casts the GPU implements too.
  BitBuffer f32(DataType::kFloat32, 0), unused(DataType::kFloat32, 0);
  mwms::testing::operand_pairs(DataType::kFloat32, &f32, &unused);
  for (DataType to : {DataType::kFloat16, DataType::kBFloat16}) {
    std::vector<std::uint16_t> want(f32.count()), got(f32.count());
    const auto* in = static_cast<const float*>(f32.data());
    mk::float32_to_16(want.data(), in, f32.count(), to);
    for (std::size_t i = 0; i < f32.count(); ++i) {
      got[i] = to == DataType::kFloat16 ? ops::float_to_half(in[i]) : ops::float_to_bfloat16(in[i]);
    }
    CHECK(want == got);
  }
}

TEST_CASE("Reducer on host buffers is kernels::reduce", "[unit][kernels]") {
  float a[3] = {1, 2, 3}, b[3] = {10, 20, 30};
  CHECK(mk::Reducer::locate(a) == mk::BufferLocation::kHost);
  CHECK(mk::Reducer::locate(nullptr) == mk::BufferLocation::kHost);
  mk::Reducer reducer;
  reducer.reduce(a, b, 3, DataType::kFloat32, ReduceOp::kSum);
  CHECK(a[0] == 11);
  CHECK(a[2] == 33);
  reducer.scale_divide(a, 3, DataType::kFloat32, 11);
  CHECK(a[0] == 1);
  CHECK(a[1] == 2);
}
