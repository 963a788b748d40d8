// CPU reduction kernels against scalar references computed here. Inputs are small integers, exact
// in every dtype (including float16/bfloat16) along with their sums and products, so results are
// compared bit for bit, not within a tolerance.
#include "kernels/reduce.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

namespace {

using mwms::DataType;
using mwms::ReduceOp;
namespace mk = mwms::kernels;

constexpr DataType kAllDtypes[] = {DataType::kFloat32, DataType::kFloat64,  DataType::kFloat16,
                                   DataType::kBFloat16, DataType::kInt32, DataType::kInt64};
constexpr DataType kFloatDtypes[] = {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16,
                                     DataType::kBFloat16};
constexpr ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMin, ReduceOp::kMax,
                                ReduceOp::kProd};

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

// Element i of a dtype buffer as a double / from a double (exact for the values used here).
double load(DataType dt, const void* base, std::size_t i) {
  switch (dt) {
    case DataType::kFloat32: return static_cast<const float*>(base)[i];
    case DataType::kFloat64: return static_cast<const double*>(base)[i];
    case DataType::kFloat16: return mk::half_to_float(static_cast<const std::uint16_t*>(base)[i]);
    case DataType::kBFloat16:
      return mk::bfloat16_to_float(static_cast<const std::uint16_t*>(base)[i]);
    case DataType::kInt32: return static_cast<const std::int32_t*>(base)[i];
    case DataType::kInt64: return static_cast<double>(static_cast<const std::int64_t*>(base)[i]);
  }
  return 0;
}

void store(DataType dt, void* base, std::size_t i, double v) {
  switch (dt) {
    case DataType::kFloat32: static_cast<float*>(base)[i] = static_cast<float>(v); return;
    case DataType::kFloat64: static_cast<double*>(base)[i] = v; return;
    case DataType::kFloat16:
      static_cast<std::uint16_t*>(base)[i] = mk::float_to_half(static_cast<float>(v));
      return;
    case DataType::kBFloat16:
      static_cast<std::uint16_t*>(base)[i] = mk::float_to_bfloat16(static_cast<float>(v));
      return;
    case DataType::kInt32: static_cast<std::int32_t*>(base)[i] = static_cast<std::int32_t>(v); return;
    case DataType::kInt64: static_cast<std::int64_t*>(base)[i] = static_cast<std::int64_t>(v); return;
  }
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

// Runs `body` on the AVX2 variant (where the CPU has it) and on the baseline variant; every
// kernel test goes through both, since which one a user gets depends on the machine.
template <typename Body>
void for_each_variant(Body body) {
  for (bool baseline : {false, true}) {
    mk::detail::force_baseline_kernels(baseline);
    INFO((baseline ? "baseline variant" : "dispatched variant"));
    body();
  }
  mk::detail::force_baseline_kernels(false);
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

// Random 16-bit pairs (any value: NaN, Inf, subnormals, inexact sums) through the block path must
// equal the scalar conversions applied per element, on both the dispatched and the baseline variant.
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
      std::vector<std::uint16_t> got[2];
      for (int baseline = 0; baseline < 2; ++baseline) {
        mk::detail::force_baseline_kernels(baseline == 1);
        got[baseline] = a;
        mk::reduce(got[baseline].data(), b.data(), count, dt, op);
      }
      mk::detail::force_baseline_kernels(false);
      INFO(label(dt, op, count));
      // Both paths must agree bit for bit, NaN payloads included.
      CHECK(std::memcmp(got[0].data(), got[1].data(), count * 2) == 0);
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < count; ++i) {
        const float x = widen(a[i]), y = widen(b[i]);
        const double r = reference_op(op, x, y);
        if (std::isnan(x) || std::isnan(y) || std::isnan(r)) {
          wrong += !std::isnan(widen(got[0][i]));
        } else {
          // The kernel computes op in float32 and rounds that once; min/max return an operand.
          float f = static_cast<float>(r);
          if (op == ReduceOp::kSum || op == ReduceOp::kMean) f = x + y;
          if (op == ReduceOp::kProd) f = x * y;
          wrong += got[0][i] != narrow(f);
        }
      }
      CHECK(wrong == 0);
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
