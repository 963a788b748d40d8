// Internals shared by the ISA variants of the CPU reduction kernels (reduce.cc, reduce_avx2.cc,
// reduce_avx512.cc): scalar bit conversions for float16/bfloat16, element functors, loops
// templated on (element type, functor), and the (dtype, op) switch that each variant instantiates
// for its own target. Private to src/kernels.
//
// Note [vectorisable loops]: every hot loop is a plain counted `for` over __restrict pointers
// whose body is branch-free (ternaries the compiler turns into blends), so GCC/Clang at -O3
// vectorise them for baseline x86-64 (SSE2). Nothing here calls out of a loop body, allocates or
// throws. dst == src is handled by a separate one-pointer loop, because passing the same pointer
// as two __restrict parameters that are written through would be undefined behaviour.
// Baseline SSE2 has no 64-bit compare or multiply, so int64 min/max/prod stay scalar there; the
// AVX2 variant vectorises min/max, the AVX-512 variant (with DQ's vpmullq) prod too.
// The kernels build with -ffp-contract=off (CMakeLists.txt): AVX-512F brings FMA forms, and a
// contracted a * b + c rounds once instead of twice, which would break bit-identity.
//
// Note [half blocks]: without SIMD intrinsics, float16/bfloat16 are processed in blocks of kBlock
// elements: widen dst and src into float32 stack arrays, combine in float32, narrow once back
// into dst. Each stage is its own simple loop, so each vectorises; a fused per-element loop with
// the conversions inline does not. The AVX2 and AVX-512 variants fuse the stages with intrinsics
// instead (Note [fused 16-bit] in reduce_avx2.cc): the blocked form's extra L1 passes made it
// compute-bound, below memory speed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/reduce.h"
#include "mwms/types.h"

#if defined(__x86_64__) || defined(__i386__)
#define MWMS_KERNELS_X86 1
#else
#define MWMS_KERNELS_X86 0
#endif

namespace mwms::kernels::detail {

constexpr std::size_t kBlock = 256;

inline std::uint32_t bits_of(float f) noexcept {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float float_of(std::uint32_t u) noexcept {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// ---- float16 / bfloat16 <-> float32, branch-free so the block loops vectorise ----------------

// Bitwise select instead of `c ? a : b`: with the default -ftrapping-math GCC will not speculate
// the float operations feeding a ternary (they might raise FP exceptions), keeps a branch and then
// refuses to vectorise the loop. Masks leave no control flow to keep.
inline std::uint32_t select(bool c, std::uint32_t a, std::uint32_t b) noexcept {
  const std::uint32_t mask = 0u - static_cast<std::uint32_t>(c);
  return (a & mask) | (b & ~mask);
}

inline float half_to_float_inline(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t mant = h & 0x3ffu;
  // Normal numbers: rebias the exponent from 15 to 127 (127 - 15 = 112).
  const std::uint32_t normal = ((exp + 112u) << 23) | (mant << 13);
  // Inf keeps a zero mantissa; a NaN keeps its payload and gets the quiet bit (as F16C does).
  const std::uint32_t inf_nan = 0x7f800000u | (mant << 13) | select(mant != 0, 0x00400000u, 0u);
  // Subnormals (and zero): mant * 2^-24 is exact in float32.
  const std::uint32_t sub = bits_of(static_cast<float>(static_cast<std::int32_t>(mant)) * 0x1p-24f);
  const std::uint32_t magnitude = select(exp == 0, sub, select(exp == 31, inf_nan, normal));
  return float_of(sign | magnitude);
}

inline std::uint16_t float_to_half_inline(float f) noexcept {
  const std::uint32_t x = bits_of(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  // |x| < 2^31, so signed compares are exact and map onto SSE2's signed vector compares.
  const std::int32_t a = static_cast<std::int32_t>(x & 0x7fffffffu);
  // Normal range: rebias, then round to nearest even on the 13 dropped bits; a mantissa carry
  // correctly bumps the exponent.
  std::uint32_t n = static_cast<std::uint32_t>(a) - (112u << 23);
  n = (n + 0x0fffu + ((n >> 13) & 1u)) >> 13;
  // Subnormal range (|f| < 2^-14): adding 0.5 puts the 2^-24 unit in the last mantissa bit, so the
  // FPU's round-to-nearest-even does the rounding; the result 0x400 (rounded up to 2^-14) is the
  // smallest normal's encoding, as it should be.
  const std::uint32_t s = bits_of(float_of(static_cast<std::uint32_t>(a)) + 0.5f) - 0x3f000000u;
  const std::uint32_t nan = 0x7e00u | ((static_cast<std::uint32_t>(a) >> 13) & 0x3ffu);
  // 0x477ff000 = 65520, halfway between 65504 (largest half) and 65536: ties-to-even goes to Inf.
  const std::uint32_t r =
      select(a > 0x7f800000, nan, select(a >= 0x477ff000, 0x7c00u, select(a >= 0x38800000, n, s)));
  return static_cast<std::uint16_t>(r | sign);
}

inline float bfloat16_to_float_inline(std::uint16_t b) noexcept {
  return float_of(static_cast<std::uint32_t>(b) << 16);
}

inline std::uint16_t float_to_bfloat16_inline(float f) noexcept {
  const std::uint32_t x = bits_of(f);
  const std::uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  // Truncating a NaN whose payload sits in the low 16 bits would produce Inf: force the quiet bit.
  const std::uint32_t nan = (x >> 16) | 0x0040u;
  const bool is_nan = static_cast<std::int32_t>(x & 0x7fffffffu) > 0x7f800000;
  return static_cast<std::uint16_t>(is_nan ? nan : rounded);
}

// ---- element functors --------------------------------------------------------------------

// Float min/max propagate NaN (see reduce.h); for integers the `a != a` test folds away.
struct SumOp {
  template <typename T>
  static T apply(T a, T b) noexcept { return a + b; }
};
struct ProdOp {
  template <typename T>
  static T apply(T a, T b) noexcept { return a * b; }
};
struct MinOp {
  template <typename T>
  static T apply(T a, T b) noexcept { return (a < b || a != a) ? a : b; }
};
struct MaxOp {
  template <typename T>
  static T apply(T a, T b) noexcept { return (a > b || a != a) ? a : b; }
};

// ---- loops (Note [vectorisable loops], Note [isa variants]) --------------------------------

template <typename Op, typename T>
[[gnu::always_inline]] inline void combine(T* __restrict dst, const T* __restrict src,
                                           std::size_t count) noexcept {
  for (std::size_t i = 0; i < count; ++i) dst[i] = Op::apply(dst[i], src[i]);
}

template <typename Op, typename T>
[[gnu::always_inline]] inline void combine_self(T* buf, std::size_t count) noexcept {
  for (std::size_t i = 0; i < count; ++i) buf[i] = Op::apply(buf[i], buf[i]);
}

template <typename Op, typename T>
[[gnu::always_inline]] inline void combine_any(T* dst, const T* src, std::size_t count) noexcept {
  if (dst == src) {
    combine_self<Op>(dst, count);
  } else {
    combine<Op>(dst, src, count);
  }
}

template <typename T, typename D>
[[gnu::always_inline]] inline void divide_loop(T* __restrict buf, std::size_t count,
                                               D divisor) noexcept {
  for (std::size_t i = 0; i < count; ++i) buf[i] = static_cast<T>(buf[i] / divisor);
}

// Block conversions between a 16-bit format and float32 (Note [half blocks]).
struct HalfCodec {
  [[gnu::always_inline]] static void widen(const std::uint16_t* __restrict in,
                                           float* __restrict out, std::size_t n) noexcept {
    for (std::size_t i = 0; i < n; ++i) out[i] = half_to_float_inline(in[i]);
  }
  [[gnu::always_inline]] static void narrow(const float* __restrict in,
                                            std::uint16_t* __restrict out, std::size_t n) noexcept {
    for (std::size_t i = 0; i < n; ++i) out[i] = float_to_half_inline(in[i]);
  }
};

struct BFloat16Codec {
  [[gnu::always_inline]] static void widen(const std::uint16_t* __restrict in,
                                           float* __restrict out, std::size_t n) noexcept {
    for (std::size_t i = 0; i < n; ++i) out[i] = bfloat16_to_float_inline(in[i]);
  }
  [[gnu::always_inline]] static void narrow(const float* __restrict in,
                                            std::uint16_t* __restrict out, std::size_t n) noexcept {
    for (std::size_t i = 0; i < n; ++i) out[i] = float_to_bfloat16_inline(in[i]);
  }
};

template <typename Codec, typename Op>
[[gnu::always_inline]] inline void combine_16bit(std::uint16_t* dst, const std::uint16_t* src,
                                                 std::size_t count) noexcept {
  alignas(64) float a[kBlock];
  alignas(64) float b[kBlock];
  for (std::size_t off = 0; off < count; off += kBlock) {
    const std::size_t n = count - off < kBlock ? count - off : kBlock;
    // Both inputs are read before dst is written, so dst == src is safe here.
    Codec::widen(dst + off, a, n);
    Codec::widen(src + off, b, n);
    combine<Op>(a, b, n);
    Codec::narrow(a, dst + off, n);
  }
}

template <typename Codec>
[[gnu::always_inline]] inline void divide_16bit(std::uint16_t* buf, std::size_t count,
                                                float divisor) noexcept {
  alignas(64) float a[kBlock];
  for (std::size_t off = 0; off < count; off += kBlock) {
    const std::size_t n = count - off < kBlock ? count - off : kBlock;
    Codec::widen(buf + off, a, n);
    divide_loop(a, n, divisor);
    Codec::narrow(a, buf + off, n);
  }
}

// A 16-bit kernel: combine<Op>() and divide() over a whole float16/bfloat16 buffer. This one goes
// through float32 blocks with Codec's conversions (Note [half blocks]); the SIMD variants fuse
// the stages instead (Note [fused 16-bit] in reduce_avx2.cc).
template <typename Codec>
struct Blocked16 {
  template <typename Op>
  [[gnu::always_inline]] static void combine(std::uint16_t* dst, const std::uint16_t* src,
                                             std::size_t count) noexcept {
    combine_16bit<Codec, Op>(dst, src, count);
  }
  [[gnu::always_inline]] static void divide(std::uint16_t* buf, std::size_t count,
                                            float divisor) noexcept {
    divide_16bit<Codec>(buf, count, divisor);
  }
};

// ---- dispatch on (dtype, op) ----------------------------------------------------------------

// Float types: every op in the element type itself.
template <typename T>
[[gnu::always_inline]] inline void reduce_float(void* dst, const void* src, std::size_t count,
                                                ReduceOp op) noexcept {
  T* d = static_cast<T*>(dst);
  const T* s = static_cast<const T*>(src);
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kMean: combine_any<SumOp>(d, s, count); return;
    case ReduceOp::kProd: combine_any<ProdOp>(d, s, count); return;
    case ReduceOp::kMin: combine_any<MinOp>(d, s, count); return;
    case ReduceOp::kMax: combine_any<MaxOp>(d, s, count); return;
  }
}

// Integers: sum/prod in the unsigned type (wraps modulo 2^N, no signed-overflow UB; the bits are
// those two's complement wrapping gives), min/max in the signed type. Accessing an intN_t object
// through its uintN_t counterpart is allowed by the aliasing rules.
template <typename S, typename U>
[[gnu::always_inline]] inline void reduce_int(void* dst, const void* src, std::size_t count,
                                              ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kMean:
      combine_any<SumOp>(static_cast<U*>(dst), static_cast<const U*>(src), count);
      return;
    case ReduceOp::kProd:
      combine_any<ProdOp>(static_cast<U*>(dst), static_cast<const U*>(src), count);
      return;
    case ReduceOp::kMin:
      combine_any<MinOp>(static_cast<S*>(dst), static_cast<const S*>(src), count);
      return;
    case ReduceOp::kMax:
      combine_any<MaxOp>(static_cast<S*>(dst), static_cast<const S*>(src), count);
      return;
  }
}

template <typename Kernel>
[[gnu::always_inline]] inline void reduce_16bit(void* dst, const void* src, std::size_t count,
                                                ReduceOp op) noexcept {
  auto* d = static_cast<std::uint16_t*>(dst);
  const auto* s = static_cast<const std::uint16_t*>(src);
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kMean: Kernel::template combine<SumOp>(d, s, count); return;
    case ReduceOp::kProd: Kernel::template combine<ProdOp>(d, s, count); return;
    case ReduceOp::kMin: Kernel::template combine<MinOp>(d, s, count); return;
    case ReduceOp::kMax: Kernel::template combine<MaxOp>(d, s, count); return;
  }
}

// Integer division by -1 overflows for the minimum value; negate in unsigned arithmetic instead
// (wraps like the integer sum does).
template <typename S, typename U>
[[gnu::always_inline]] inline void divide_int(void* buffer, std::size_t count,
                                              int divisor) noexcept {
  if (divisor == -1) {
    U* p = static_cast<U*>(buffer);
    for (std::size_t i = 0; i < count; ++i) p[i] = static_cast<U>(U{0} - p[i]);
    return;
  }
  divide_loop(static_cast<S*>(buffer), count, static_cast<S>(divisor));
}

// Note [isa variants]: the whole (dtype, op) switch below is instantiated once per instruction
// set: for baseline x86-64 in reduce.cc, inside target("avx2,f16c") functions in reduce_avx2.cc
// and inside AVX-512 ones in reduce_avx512.cc. Every helper in this header is always_inline so
// that its loops are compiled, and vectorised, for the caller's target; an out-of-line helper
// would be shared and stay baseline. Only functions carry target attributes, never a whole file
// (no -mavx2): an inline function that the linker merges across files must be baseline code in
// each of them, or a baseline caller could land in an AVX copy. Isa::Float16 and Isa::BFloat16
// pick the 16-bit kernels. The variants must agree bit for bit (the unit tests compare them on
// edge values), so none may use an instruction whose result differs from the portable code's:
// no approximate reciprocals, no FTZ/DAZ, no FMA contraction, no vcvtneps2bf16 (it flushes
// subnormals).
template <typename Isa>
[[gnu::always_inline]] inline void reduce_impl(void* dst, const void* src, std::size_t count,
                                               DataType dtype, ReduceOp op) noexcept {
  switch (dtype) {
    case DataType::kFloat32: reduce_float<float>(dst, src, count, op); return;
    case DataType::kFloat64: reduce_float<double>(dst, src, count, op); return;
    case DataType::kFloat16: reduce_16bit<typename Isa::Float16>(dst, src, count, op); return;
    case DataType::kBFloat16: reduce_16bit<typename Isa::BFloat16>(dst, src, count, op); return;
    case DataType::kInt32: reduce_int<std::int32_t, std::uint32_t>(dst, src, count, op); return;
    case DataType::kInt64: reduce_int<std::int64_t, std::uint64_t>(dst, src, count, op); return;
  }
}

template <typename Isa>
[[gnu::always_inline]] inline void scale_divide_impl(void* buffer, std::size_t count,
                                                     DataType dtype, int divisor) noexcept {
  auto* half = static_cast<std::uint16_t*>(buffer);
  switch (dtype) {
    case DataType::kFloat32:
      divide_loop(static_cast<float*>(buffer), count, static_cast<float>(divisor));
      return;
    case DataType::kFloat64:
      divide_loop(static_cast<double*>(buffer), count, static_cast<double>(divisor));
      return;
    case DataType::kFloat16: Isa::Float16::divide(half, count, static_cast<float>(divisor)); return;
    case DataType::kBFloat16:
      Isa::BFloat16::divide(half, count, static_cast<float>(divisor));
      return;
    case DataType::kInt32: divide_int<std::int32_t, std::uint32_t>(buffer, count, divisor); return;
    case DataType::kInt64: divide_int<std::int64_t, std::uint64_t>(buffer, count, divisor); return;
  }
}

// ---- the variants' entry points (Note [isa variants]) ---------------------------------------

void reduce_baseline(void* dst, const void* src, std::size_t count, DataType dtype,
                     ReduceOp op) noexcept;
void scale_divide_baseline(void* buffer, std::size_t count, DataType dtype, int divisor) noexcept;
#if MWMS_KERNELS_X86
void reduce_avx2(void* dst, const void* src, std::size_t count, DataType dtype,
                 ReduceOp op) noexcept;
void scale_divide_avx2(void* buffer, std::size_t count, DataType dtype, int divisor) noexcept;
void reduce_avx512(void* dst, const void* src, std::size_t count, DataType dtype,
                   ReduceOp op) noexcept;
void scale_divide_avx512(void* buffer, std::size_t count, DataType dtype, int divisor) noexcept;
#endif

}  // namespace mwms::kernels::detail
