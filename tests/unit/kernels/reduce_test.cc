// CPU reduction kernels against scalar references computed here. Inputs are small integers, exact
// in every dtype (including float16/bfloat16) along with their sums and products, so results are
// compared bit for bit, not within a tolerance. Every test runs on each ISA variant the CPU has
// (baseline, AVX2, AVX-512), and one compares the variants with each other on edge values.
#include "kernels/reduce.h"
#include "support/values.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace {

using mwms::testing::store;
using mwms::testing::load;

using mwms::DataType;
using mwms::ReduceOp;
namespace mk = mwms::kernels;
using mk::detail::KernelIsa;

using mwms::testing::kAllDtypes;
using mwms::testing::kAllOps;
constexpr DataType kFloatDtypes[] = {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16,
                                     DataType::kBFloat16};

std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

float bits_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

double reference_op(ReduceOp op, double a, double b) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kMean: return a + b;
    case ReduceOp::kProd: return a * b;
    case ReduceOp::kMin: return b < a ? b : a;
    case ReduceOp::kMax: return b > a ? b : a;
  }
  return 0;
}

// Deterministic value in [-15, 15]: sums and products stay exact in bfloat16 (8 significant bits).
double small_value(std::size_t i, std::uint64_t seed) {
  std::uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ull ^ seed;
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 29;
  return static_cast<double>(static_cast<int>(x % 31) - 15);
}

// `count` elements with one guard element on each side; data() points past the first guard, which
// also makes the data misaligned for 16-byte vectors.
struct Buffer {
  Buffer(DataType dt, std::size_t count)
      : esize(mwms::dtype_size(dt)), bytes((count + 2) * esize, 0xA5) {}
  void* data() { return bytes.data() + esize; }
  std::size_t esize;
  std::vector<unsigned char> bytes;
};

// Index of the first element that differs (guards included, shifted by one), or -1.
long first_mismatch(const Buffer& got, const Buffer& want) {
  for (std::size_t i = 0; i < got.bytes.size(); ++i) {
    if (got.bytes[i] != want.bytes[i]) return static_cast<long>(i / got.esize) - 1;
  }
  return -1;
}

std::string label(DataType dt, ReduceOp op, std::size_t count) {
  return std::string(mwms::to_string(dt)) + " " + std::string(mwms::to_string(op)) + " count " +
         std::to_string(count);
}

// The ISA variants this CPU can run, baseline first.
std::vector<KernelIsa> available_isas() {
  std::vector<KernelIsa> isas;
  for (KernelIsa isa : mk::detail::kAllKernelIsas) {
    if (mk::detail::kernel_isa_available(isa)) isas.push_back(isa);
  }
  return isas;
}

// Forces one variant for its lifetime; restores the default even when a REQUIRE throws.
class ForcedIsa {
 public:
  explicit ForcedIsa(KernelIsa isa) {
    mk::detail::force_kernel_isa(isa);
    REQUIRE(mk::detail::active_kernel_isa() == isa);
  }
  ~ForcedIsa() { mk::detail::force_kernel_isa(std::nullopt); }
  ForcedIsa(const ForcedIsa&) = delete;
  ForcedIsa& operator=(const ForcedIsa&) = delete;
};

// Runs `body` on every variant the CPU has; every kernel test goes through all of them, since
// which one a user gets depends on the machine.
template <typename Body>
void for_each_variant(Body body) {
  for (KernelIsa isa : available_isas()) {
    ForcedIsa forced(isa);
    INFO(std::string(mk::detail::to_string(isa)) + " variant");
    body();
  }
}

void check_against_reference(DataType dt, ReduceOp op, std::size_t count) {
  Buffer dst(dt, count), src(dt, count), want(dt, count);
  for (std::size_t i = 0; i < count; ++i) {
    const double a = small_value(i, 1), b = small_value(i, 2);
    store(dt, dst.data(), i, a);
    store(dt, src.data(), i, b);
    store(dt, want.data(), i, reference_op(op, a, b));
  }
  mk::reduce(dst.data(), src.data(), count, dt, op);
  INFO(label(dt, op, count));
  CHECK(first_mismatch(dst, want) == -1);
}

}  // namespace

TEST_CASE("reduce matches a scalar reference for every dtype x op x count", "[unit][kernels]") {
  for_each_variant([] {
    for (std::size_t count : {0, 1, 7, 255, 256, 257, 1000003}) {
      for (DataType dt : kAllDtypes) {
        for (ReduceOp op : kAllOps) check_against_reference(dt, op, count);
      }
    }
  });
}

TEST_CASE("reduce with dst == src combines each element with itself", "[unit][kernels]") {
  const std::size_t count = 1000;
  for_each_variant([&] {
    for (DataType dt : kAllDtypes) {
      for (ReduceOp op : kAllOps) {
        Buffer buf(dt, count), want(dt, count);
        for (std::size_t i = 0; i < count; ++i) {
          const double a = small_value(i, 3);
          store(dt, buf.data(), i, a);
          store(dt, want.data(), i, reference_op(op, a, a));
        }
        mk::reduce(buf.data(), buf.data(), count, dt, op);
        INFO(label(dt, op, count));
        CHECK(first_mismatch(buf, want) == -1);
      }
    }
  });
}

TEST_CASE("float min and max propagate NaN from either operand", "[unit][kernels]") {
  const std::size_t count = 1001;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for_each_variant([&] {
    for (DataType dt : kFloatDtypes) {
      for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
        Buffer dst(dt, count), src(dt, count);
        for (std::size_t i = 0; i < count; ++i) {
          // NaN in dst at i % 3 == 1, in src at i % 5 == 2, Inf mixed in elsewhere.
          store(dt, dst.data(), i, i % 3 == 1 ? nan : (i % 7 == 0 ? -inf : small_value(i, 4)));
          store(dt, src.data(), i, i % 5 == 2 ? nan : (i % 11 == 0 ? inf : small_value(i, 5)));
        }
        Buffer before = dst;
        mk::reduce(dst.data(), src.data(), count, dt, op);
        INFO(label(dt, op, count));
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < count; ++i) {
          const double a = load(dt, before.data(), i), b = load(dt, src.data(), i);
          const double got = load(dt, dst.data(), i);
          if (std::isnan(a) || std::isnan(b)) {
            wrong += !std::isnan(got);
          } else {
            wrong += got != reference_op(op, a, b);
          }
        }
        CHECK(wrong == 0);
      }
    }
  });
}

namespace {

// Pairs tiled over 37 elements so that vector bodies and scalar tails both see every case.
template <typename S>
void check_integer_edges(DataType dt) {
  using L = std::numeric_limits<S>;
  const S k = static_cast<S>(S{1} << (sizeof(S) * 4));  // 2^16 or 2^32: k * k wraps to 0
  const S a_vals[] = {L::max(), L::min(), k, static_cast<S>(k + 1), -1, L::min(), 5};
  const S b_vals[] = {1, -1, k, static_cast<S>(k + 1), 1, L::max(), -7};
  const std::size_t n = 37;
  auto run = [&](ReduceOp op) {
    std::vector<S> dst(n), src(n);
    for (std::size_t i = 0; i < n; ++i) {
      dst[i] = a_vals[i % 7];
      src[i] = b_vals[i % 7];
    }
    mk::reduce(dst.data(), src.data(), n, dt, op);
    return dst;
  };
  const std::vector<S> sum = run(ReduceOp::kSum), prod = run(ReduceOp::kProd);
  const std::vector<S> min = run(ReduceOp::kMin), max = run(ReduceOp::kMax);
  for (std::size_t i = 0; i + 7 <= n; i += 7) {
    INFO(std::string(mwms::to_string(dt)) + " element " + std::to_string(i));
    CHECK(sum[i] == L::min());       // max + 1 wraps
    CHECK(sum[i + 1] == L::max());   // min - 1 wraps
    CHECK(prod[i + 2] == 0);         // 2^N wraps to 0
    CHECK(prod[i + 3] == 2 * k + 1); // (k + 1)^2 = 2^N + 2k + 1
    CHECK(prod[i + 6] == -35);
    CHECK(min[i + 4] == -1);         // signed, not unsigned, comparison
    CHECK(max[i + 4] == 1);
    CHECK(min[i + 5] == L::min());
    CHECK(max[i + 5] == L::max());
    CHECK(sum[i + 6] == -2);
  }
}

}  // namespace

TEST_CASE("integer sum and prod wrap while min and max compare signed", "[unit][kernels]") {
  for_each_variant([] {
    check_integer_edges<std::int32_t>(DataType::kInt32);
    check_integer_edges<std::int64_t>(DataType::kInt64);
  });
}

TEST_CASE("half_to_float decodes every float16 bit pattern", "[unit][kernels]") {
  std::size_t wrong = 0;
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const int sign = (h >> 15) ? -1 : 1;
    const int exp = static_cast<int>((h >> 10) & 0x1f);
    const int mant = static_cast<int>(h & 0x3ff);
    const float got = mk::half_to_float(static_cast<std::uint16_t>(h));
    if (exp == 31 && mant != 0) {
      // NaN: stays NaN with its sign, payload kept, quiet bit set.
      const std::uint32_t want_bits =
          (static_cast<std::uint32_t>(h >> 15) << 31) | 0x7fc00000u | (static_cast<std::uint32_t>(mant) << 13);
      wrong += float_bits(got) != want_bits;
      continue;
    }
    double want;
    if (exp == 31) {
      want = std::numeric_limits<double>::infinity();
    } else if (exp == 0) {
      want = std::ldexp(mant, -24);
    } else {
      want = std::ldexp(1024 + mant, exp - 25);
    }
    want *= sign;
    // Compare bits so that -0.0 must decode to -0.0.
    wrong += float_bits(got) != float_bits(static_cast<float>(want));
  }
  CHECK(wrong == 0);
}

TEST_CASE("float16 and bfloat16 round-trip every bit pattern", "[unit][kernels]") {
  std::size_t half_wrong = 0, bf16_wrong = 0;
  for (std::uint32_t x = 0; x < 65536; ++x) {
    const auto h = static_cast<std::uint16_t>(x);
    const bool half_nan = (x & 0x7c00) == 0x7c00 && (x & 0x3ff) != 0;
    const std::uint16_t h2 = mk::float_to_half(mk::half_to_float(h));
    // A NaN comes back a NaN with the same sign and the quiet bit set; everything else exactly.
    half_wrong += half_nan ? h2 != (x | 0x200) : h2 != h;

    const bool bf16_nan = (x & 0x7f80) == 0x7f80 && (x & 0x7f) != 0;
    const float f = mk::bfloat16_to_float(h);
    bf16_wrong += float_bits(f) != (x << 16);  // bfloat16 is the upper half of a float32
    const std::uint16_t b2 = mk::float_to_bfloat16(f);
    bf16_wrong += bf16_nan ? b2 != (x | 0x40) : b2 != h;
  }
  CHECK(half_wrong == 0);
  CHECK(bf16_wrong == 0);
}

TEST_CASE("float_to_half rounds to nearest even and handles overflow and subnormals",
          "[unit][kernels]") {
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(mk::float_to_half(1.0f) == 0x3c00);
  CHECK(mk::float_to_half(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);      // tie -> even (down)
  CHECK(mk::float_to_half(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);  // tie -> even (up)
  CHECK(mk::float_to_half(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)) == 0x3c01);
  CHECK(mk::float_to_half(2047.0f + 0.5f) == 0x6800);  // 2047.5: tie rounds up into next binade
  CHECK(mk::float_to_half(-2.0f) == 0xc000);
  CHECK(mk::float_to_half(-0.0f) == 0x8000);
  CHECK(mk::float_to_half(0.0f) == 0x0000);
  // Overflow: 65504 is the largest half; 65520 is the tie between it and 2^16 and goes to Inf.
  CHECK(mk::float_to_half(65504.0f) == 0x7bff);
  CHECK(mk::float_to_half(65519.0f) == 0x7bff);
  CHECK(mk::float_to_half(65520.0f) == 0x7c00);
  CHECK(mk::float_to_half(1e10f) == 0x7c00);
  CHECK(mk::float_to_half(-1e10f) == 0xfc00);
  CHECK(mk::float_to_half(inf) == 0x7c00);
  CHECK(mk::float_to_half(-inf) == 0xfc00);
  // Subnormals: unit 2^-24; ties go to even.
  CHECK(mk::float_to_half(std::ldexp(1.0f, -24)) == 0x0001);
  CHECK(mk::float_to_half(std::ldexp(1.0f, -25)) == 0x0000);          // 0.5 unit -> 0
  CHECK(mk::float_to_half(std::ldexp(1.0001f, -25)) == 0x0001);       // just above the tie
  CHECK(mk::float_to_half(std::ldexp(3.0f, -25)) == 0x0002);          // 1.5 units -> 2
  CHECK(mk::float_to_half(std::ldexp(1023.0f, -24)) == 0x03ff);       // largest subnormal
  CHECK(mk::float_to_half(std::ldexp(1023.5f, -24)) == 0x0400);       // tie -> smallest normal
  CHECK(mk::float_to_half(-std::ldexp(5.0f, -24)) == 0x8005);
  CHECK(mk::float_to_half(1e-40f) == 0x0000);                          // float32 subnormal
  CHECK(mk::float_to_half(-1e-40f) == 0x8000);
  // NaN stays NaN, also one whose payload sits only in bits that do not fit.
  const std::uint16_t n1 = mk::float_to_half(std::numeric_limits<float>::quiet_NaN());
  const std::uint16_t n2 = mk::float_to_half(bits_float(0x7f800001u));
  CHECK(((n1 & 0x7c00) == 0x7c00 && (n1 & 0x3ff) != 0));
  CHECK(n2 == 0x7e00);
  CHECK(mk::float_to_half(bits_float(0xff800001u)) == 0xfe00);
}

TEST_CASE("float_to_bfloat16 rounds to nearest even and handles overflow and NaN",
          "[unit][kernels]") {
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(mk::float_to_bfloat16(1.0f) == 0x3f80);
  CHECK(mk::float_to_bfloat16(1.0f + std::ldexp(1.0f, -8)) == 0x3f80);      // tie -> even (down)
  CHECK(mk::float_to_bfloat16(1.0f + 3 * std::ldexp(1.0f, -8)) == 0x3f82);  // tie -> even (up)
  CHECK(mk::float_to_bfloat16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)) == 0x3f81);
  CHECK(mk::float_to_bfloat16(-0.0f) == 0x8000);
  CHECK(mk::float_to_bfloat16(std::numeric_limits<float>::max()) == 0x7f80);  // rounds to Inf
  CHECK(mk::float_to_bfloat16(bits_float(0x7f7f7fffu)) == 0x7f7f);
  CHECK(mk::float_to_bfloat16(-inf) == 0xff80);
  CHECK(mk::float_to_bfloat16(bits_float(0x00010000u)) == 0x0001);  // subnormal kept
  CHECK(mk::float_to_bfloat16(bits_float(0x00018000u)) == 0x0002);  // subnormal tie -> even
  // Truncating 0x7f800001 would give 0x7f80 (Inf): it must stay a NaN.
  CHECK(mk::float_to_bfloat16(bits_float(0x7f800001u)) == 0x7fc0);
  CHECK(mk::float_to_bfloat16(bits_float(0xffc00000u)) == 0xffc0);
}

// Random 16-bit pairs (any value: NaN, Inf, subnormals, inexact sums) must equal the scalar
// conversions applied per element, on every variant (the blocked and the fused 16-bit paths).
TEST_CASE("16-bit reduce rounds once like the scalar conversions", "[unit][kernels]") {
  const std::size_t count = 70001;
  for (DataType dt : {DataType::kFloat16, DataType::kBFloat16}) {
    const bool half = dt == DataType::kFloat16;
    auto widen = [&](std::uint16_t v) {
      return half ? mk::half_to_float(v) : mk::bfloat16_to_float(v);
    };
    auto narrow = [&](float v) { return half ? mk::float_to_half(v) : mk::float_to_bfloat16(v); };
    std::vector<std::uint16_t> a(count), b(count);
    std::uint32_t state = 12345;
    for (std::size_t i = 0; i < count; ++i) {
      state = state * 1664525u + 1013904223u;
      a[i] = static_cast<std::uint16_t>(state >> 16);
      b[i] = static_cast<std::uint16_t>(state);
    }
    for (ReduceOp op : kAllOps) {
      for_each_variant([&] {
        std::vector<std::uint16_t> got = a;
        mk::reduce(got.data(), b.data(), count, dt, op);
        INFO(label(dt, op, count));
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < count; ++i) {
          const float x = widen(a[i]), y = widen(b[i]);
          const double r = reference_op(op, x, y);
          if (std::isnan(x) || std::isnan(y) || std::isnan(r)) {
            wrong += !std::isnan(widen(got[i]));
          } else {
            // The kernel computes op in float32 and rounds that once; min/max return an operand.
            float f = static_cast<float>(r);
            if (op == ReduceOp::kSum || op == ReduceOp::kMean) f = x + y;
            if (op == ReduceOp::kProd) f = x * y;
            wrong += got[i] != narrow(f);
          }
        }
        CHECK(wrong == 0);
      });
    }
  }
}

TEST_CASE("scale_divide divides every dtype", "[unit][kernels]") {
  float f32[] = {3.0f, -9.0f, 1.0f, 0.0f};
  mk::scale_divide(f32, 4, DataType::kFloat32, 2);
  CHECK(f32[0] == 1.5f);
  CHECK(f32[1] == -4.5f);
  CHECK(f32[2] == 0.5f);
  CHECK(f32[3] == 0.0f);
  double f64[] = {1.0, -7.0};
  mk::scale_divide(f64, 2, DataType::kFloat64, 3);
  CHECK(f64[0] == 1.0 / 3.0);
  CHECK(f64[1] == -7.0 / 3.0);
  // float16/bfloat16: divided in float32 and rounded once.
  std::uint16_t h[] = {mk::float_to_half(1.0f), mk::float_to_half(-6.0f)};
  mk::scale_divide(h, 2, DataType::kFloat16, 3);
  CHECK(h[0] == mk::float_to_half(1.0f / 3.0f));
  CHECK(h[0] == 0x3555);
  CHECK(mk::half_to_float(h[1]) == -2.0f);
  std::uint16_t bf[] = {mk::float_to_bfloat16(1.0f), mk::float_to_bfloat16(10.0f)};
  mk::scale_divide(bf, 2, DataType::kBFloat16, 3);
  CHECK(bf[0] == mk::float_to_bfloat16(1.0f / 3.0f));
  CHECK(bf[0] == 0x3eab);
  CHECK(bf[1] == mk::float_to_bfloat16(10.0f / 3.0f));
  // Integers truncate toward zero; -1 wraps the minimum like unsigned negation.
  std::int32_t i32[] = {7, -7, std::numeric_limits<std::int32_t>::min(), 1};
  mk::scale_divide(i32, 4, DataType::kInt32, 2);
  CHECK(i32[0] == 3);
  CHECK(i32[1] == -3);
  CHECK(i32[2] == -1073741824);
  CHECK(i32[3] == 0);
  std::int64_t i64[] = {-9, 9, std::numeric_limits<std::int64_t>::min()};
  mk::scale_divide(i64, 2, DataType::kInt64, 4);
  CHECK(i64[0] == -2);
  CHECK(i64[1] == 2);
  mk::scale_divide(i64 + 2, 1, DataType::kInt64, -1);
  CHECK(i64[2] == std::numeric_limits<std::int64_t>::min());

  // A long buffer of every dtype (several 16-bit blocks plus a tail): 4 * v / 4 == v exactly.
  const std::size_t count = 1000003;
  for_each_variant([&] {
    for (DataType dt : kAllDtypes) {
      Buffer buf(dt, count), want(dt, count);
      for (std::size_t i = 0; i < count; ++i) {
        store(dt, buf.data(), i, 4 * small_value(i, 6));
        store(dt, want.data(), i, small_value(i, 6));
      }
      mk::scale_divide(buf.data(), count, dt, 4);
      INFO(mwms::to_string(dt));
      CHECK(first_mismatch(buf, want) == -1);
    }
  });
}

// ---- the variants against each other -------------------------------------------------------

namespace {

// Bit patterns worth pairing with each other: ±0, the smallest and largest subnormals, the
// smallest normal, the largest finite, ±Inf, quiet and signalling NaNs (with and without payload
// bits, either sign), ±1 and 1 + 1 ulp (whose sums and products round); float32 also 2^-24 and
// 65520 (float16's smallest subnormal and its rounding edge to Inf). Integers: 0, ±1 and the
// wrap-around values.
std::vector<std::uint64_t> edge_bits(DataType dt) {
  switch (dt) {
    case DataType::kFloat32:
      return {0x00000000, 0x80000000, 0x00000001, 0x807fffff, 0x00800000, 0x7f7fffff,
              0xff7fffff, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00001, 0x7f800001,
              0x7fbfffff, 0x3f800000, 0xbf800000, 0x3f800001, 0x33800000, 0x477ff000};
    case DataType::kFloat64:
      return {0x0000000000000000, 0x8000000000000000, 0x0000000000000001, 0x800fffffffffffff,
              0x0010000000000000, 0x7fefffffffffffff, 0xffefffffffffffff, 0x7ff0000000000000,
              0xfff0000000000000, 0x7ff8000000000000, 0xfff8000000000001, 0x7ff0000000000001,
              0x7ff7ffffffffffff, 0x3ff0000000000000, 0xbff0000000000000, 0x3ff0000000000001};
    case DataType::kFloat16:
      return {0x0000, 0x8000, 0x0001, 0x83ff, 0x0400, 0x7bff, 0xfbff, 0x7c00, 0xfc00,
              0x7e00, 0xfe01, 0x7c01, 0x7dff, 0x3c00, 0xbc00, 0x3c01, 0x0200};
    case DataType::kBFloat16:
      return {0x0000, 0x8000, 0x0001, 0x807f, 0x0080, 0x7f7f, 0xff7f, 0x7f80, 0xff80,
              0x7fc0, 0xffc1, 0x7f81, 0x7fbf, 0x3f80, 0xbf80, 0x3f81, 0x0040};
    case DataType::kInt32:
      return {0, 1, 0xffffffff, 0x80000000, 0x7fffffff, 0x00010000, 0x00010001, 0xfffeffff};
    case DataType::kInt64:
      return {0, 1, ~0ull, 0x8000000000000000, 0x7fffffffffffffff, 0x100000000, 0x100000001,
              0xfffffffeffffffff};
  }
  return {};
}

std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 29;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 32);
}

// Element i of an input: while i < E * E, the pair (i / E, i % E) of edge values (`which` picks
// the first or the second of the pair), so a long enough buffer holds every ordered pair; after
// that, and for short buffers, random bits half of the time and a random edge value otherwise.
std::uint64_t input_bits(DataType dt, std::size_t i, std::size_t count, int which) {
  const std::vector<std::uint64_t> edges = edge_bits(dt);
  const std::size_t e = edges.size();
  if (count >= e * e && i < e * e) return edges[which == 0 ? i / e : i % e];
  const std::uint64_t r = mix(i * 2 + static_cast<std::uint64_t>(which) + 0x5eed);
  return (r & 1) != 0 ? edges[(r >> 1) % e] : mix(r);
}

bool is_nan_bits(DataType dt, std::uint64_t x) {
  switch (dt) {
    case DataType::kFloat32: return (x & 0x7fffffff) > 0x7f800000;
    case DataType::kFloat64: return (x & 0x7fffffffffffffff) > 0x7ff0000000000000;
    case DataType::kFloat16: return (x & 0x7fff) > 0x7c00;
    case DataType::kBFloat16: return (x & 0x7fff) > 0x7f80;
    case DataType::kInt32:
    case DataType::kInt64: return false;
  }
  return false;
}

// A 64-byte aligned allocation holding `count` elements at `offset` elements past the alignment
// (so vectors see misaligned data), with guard bytes all around.
class Arena {
 public:
  Arena(DataType dt, std::size_t count, std::size_t offset)
      : esize_(mwms::dtype_size(dt)), bytes_(count * esize_ + offset * esize_ + 192, 0xA5) {
    const auto base = reinterpret_cast<std::uintptr_t>(bytes_.data());
    start_ = ((base + 63) & ~std::uintptr_t{63}) - base + 64 + offset * esize_;
  }
  void* data() { return bytes_.data() + start_; }
  void set(std::size_t i, std::uint64_t bits) {
    std::memcpy(bytes_.data() + start_ + i * esize_, &bits, esize_);  // little-endian low bytes
  }
  std::uint64_t get(std::size_t i) const {
    std::uint64_t bits = 0;
    std::memcpy(&bits, bytes_.data() + start_ + i * esize_, esize_);
    return bits;
  }
  // Bytes outside the `count` elements that differ from the fill pattern.
  std::size_t damaged_guards(std::size_t count) const {
    std::size_t damaged = 0;
    for (std::size_t i = 0; i < bytes_.size(); ++i) {
      const bool inside = i >= start_ && i < start_ + count * esize_;
      damaged += !inside && bytes_[i] != 0xA5;
    }
    return damaged;
  }

 private:
  std::size_t esize_;
  std::vector<unsigned char> bytes_;
  std::size_t start_ = 0;
};

constexpr std::size_t kCrossCounts[] = {0, 1, 7, 15, 16, 17, 31, 33, 63, 64, 65, 1000, 4099};

// reduce() of one (dtype, op, count, alignment) on every variant: each result, guards included,
// must equal the baseline's byte for byte. The one freedom reduce.h leaves: when both operands of
// a sum or product are NaN, which payload survives is unspecified, so there only NaN-ness is
// compared: x86 returns the first operand's payload and compilers swap the operands of a
// commutative add or multiply freely (GCC 12 does, between the baseline and AVX2 float64 sums).
void check_variants_agree(DataType dt, ReduceOp op, std::size_t count, std::size_t dst_offset,
                          std::size_t src_offset, bool in_place) {
  const std::vector<KernelIsa> isas = available_isas();
  std::vector<Arena> results;
  Arena src(dt, count, src_offset);
  for (std::size_t i = 0; i < count; ++i) src.set(i, input_bits(dt, i, count, 1));
  for (KernelIsa isa : isas) {
    results.emplace_back(dt, count, dst_offset);
    Arena& dst = results.back();
    for (std::size_t i = 0; i < count; ++i) dst.set(i, input_bits(dt, i, count, 0));
    ForcedIsa forced(isa);
    mk::reduce(dst.data(), in_place ? dst.data() : src.data(), count, dt, op);
  }
  const bool arithmetic = op != ReduceOp::kMin && op != ReduceOp::kMax;
  for (std::size_t v = 1; v < isas.size(); ++v) {
    INFO(label(dt, op, count) + " dst offset " + std::to_string(dst_offset) + " src offset " +
         std::to_string(src_offset) + (in_place ? " in place" : "") + ": " +
         std::string(mk::detail::to_string(isas[v])) + " vs baseline");
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < count; ++i) {
      const std::uint64_t a = input_bits(dt, i, count, 0);
      const std::uint64_t b = in_place ? a : src.get(i);
      const std::uint64_t want = results[0].get(i), got = results[v].get(i);
      if (arithmetic && is_nan_bits(dt, a) && is_nan_bits(dt, b)) {
        wrong += !is_nan_bits(dt, got);
      } else {
        wrong += got != want;
      }
    }
    CHECK(wrong == 0);
    // Outside [0, count): untouched by every variant (masked tails included).
    CHECK(results[v].damaged_guards(count) == 0);
  }
}

}  // namespace

TEST_CASE("variants agree bit for bit on edge values for every dtype x op", "[unit][kernels]") {
  INFO("variants: " + std::to_string(available_isas().size()));
  for (DataType dt : kAllDtypes) {
    for (ReduceOp op : kAllOps) {
      for (std::size_t count : kCrossCounts) {
        check_variants_agree(dt, op, count, 0, 0, false);
        check_variants_agree(dt, op, count, 1, 3, false);
        check_variants_agree(dt, op, count, 5, 2, false);
        check_variants_agree(dt, op, count, 3, 0, true);
      }
    }
  }
}

TEST_CASE("variants agree bit for bit on scale_divide for every dtype", "[unit][kernels]") {
  const std::vector<KernelIsa> isas = available_isas();
  for (DataType dt : kAllDtypes) {
    for (int divisor : {2, 3, 7, -1, -8, 1000}) {
      for (std::size_t count : kCrossCounts) {
        std::vector<Arena> results;
        for (KernelIsa isa : isas) {
          results.emplace_back(dt, count, 1);
          Arena& buf = results.back();
          for (std::size_t i = 0; i < count; ++i) buf.set(i, input_bits(dt, i, count, 0));
          ForcedIsa forced(isa);
          mk::scale_divide(buf.data(), count, dt, divisor);
        }
        for (std::size_t v = 1; v < isas.size(); ++v) {
          INFO(std::string(mwms::to_string(dt)) + " divisor " + std::to_string(divisor) +
               " count " + std::to_string(count) + ": " +
               std::string(mk::detail::to_string(isas[v])) + " vs baseline");
          // One operand: NaN payloads are determined, so every element must match.
          std::size_t wrong = 0;
          for (std::size_t i = 0; i < count; ++i) wrong += results[v].get(i) != results[0].get(i);
          CHECK(wrong == 0);
          CHECK(results[v].damaged_guards(count) == 0);
        }
      }
    }
  }
}

TEST_CASE("force_kernel_isa picks a variant and falls back to the best available",
          "[unit][kernels]") {
  const std::vector<KernelIsa> isas = available_isas();
  REQUIRE(isas.front() == KernelIsa::kBaseline);
  const KernelIsa best = isas.back();
  CHECK(mk::detail::active_kernel_isa() == best);
  for (KernelIsa isa : mk::detail::kAllKernelIsas) {
    mk::detail::force_kernel_isa(isa);
    const KernelIsa want = mk::detail::kernel_isa_available(isa) ? isa : best;
    CHECK(mk::detail::active_kernel_isa() == want);
  }
  mk::detail::force_kernel_isa(std::nullopt);
  CHECK(mk::detail::active_kernel_isa() == best);
  CHECK(mk::detail::to_string(KernelIsa::kAvx512) == "avx512");
  // AVX-512 implies AVX2 here (the variants form a chain).
  if (mk::detail::kernel_isa_available(KernelIsa::kAvx512)) {
    CHECK(mk::detail::kernel_isa_available(KernelIsa::kAvx2));
  }
}
