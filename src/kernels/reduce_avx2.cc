// The AVX2 + F16C variant of the CPU reduction kernels (Note [isa variants] in reduce_impl.h):
// float32/float64/integer loops auto-vectorised for 256-bit registers, float16/bfloat16 through
// fused intrinsic loops.
//
// Note [fused 16-bit]: the float16/bfloat16 loops of the SIMD variants load a register of dst
// and one of src, widen both to float32 in registers, combine, narrow and store, so memory sees
// what a float32 loop of half the size would. The blocked form (Note [half blocks]) spends four
// extra L1 passes per element and ran at 18-25 GB/s against 40 GB/s for memory on a Zen 3 core.
// A codec does one register: load, store, combine<Op> and divide; the tail (fewer than kStep
// elements) runs the same code on a zero-padded copy (AVX-512 uses masked loads instead), so
// every element of a buffer takes the same path. Results match the portable code bit for bit:
// vcvtph2ps/vcvtps2ph round to nearest even and quiet NaNs exactly as half_to_float_inline()/
// float_to_half_inline() do, and the bfloat16 narrowing is float_to_bfloat16_inline() lane by
// lane (a float compare unordered-with-itself is the same NaN test as its integer one).
#include "kernels/reduce_impl.h"

#if MWMS_KERNELS_X86

#include <immintrin.h>

#include <cstring>

#define MWMS_KERNELS_AVX2_TARGET "avx2,f16c"

namespace mwms::kernels::detail {
namespace {

// The element functors on 8 float32 lanes; min/max select exactly as MinOp/MaxOp do (a if a < b
// or a is NaN, else b), so NaN payloads and signed zeros come out as in the other variants.
template <typename Op>
struct Vec256;
template <>
struct Vec256<SumOp> {
  [[gnu::always_inline]] __attribute__((target(MWMS_KERNELS_AVX2_TARGET))) static __m256 apply(
      __m256 a, __m256 b) noexcept {
    return _mm256_add_ps(a, b);
  }
};
template <>
struct Vec256<ProdOp> {
  [[gnu::always_inline]] __attribute__((target(MWMS_KERNELS_AVX2_TARGET))) static __m256 apply(
      __m256 a, __m256 b) noexcept {
    return _mm256_mul_ps(a, b);
  }
};
template <>
struct Vec256<MinOp> {
  [[gnu::always_inline]] __attribute__((target(MWMS_KERNELS_AVX2_TARGET))) static __m256 apply(
      __m256 a, __m256 b) noexcept {
    const __m256 take_a =
        _mm256_or_ps(_mm256_cmp_ps(a, b, _CMP_LT_OQ), _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
    return _mm256_blendv_ps(b, a, take_a);
  }
};
template <>
struct Vec256<MaxOp> {
  [[gnu::always_inline]] __attribute__((target(MWMS_KERNELS_AVX2_TARGET))) static __m256 apply(
      __m256 a, __m256 b) noexcept {
    const __m256 take_a =
        _mm256_or_ps(_mm256_cmp_ps(a, b, _CMP_GT_OQ), _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
    return _mm256_blendv_ps(b, a, take_a);
  }
};

// 8 float16 per register (128 bits), widened to 8 float32 lanes.
struct HalfAvx2 {
  static constexpr std::size_t kStep = 8;
  using Packed = __m128i;
  [[gnu::always_inline]] __attribute__((target(MWMS_KERNELS_AVX2_TARGET))) static Packed load(
      const std::uint16_t* p) noexcept {
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  }
  [[gnu::always_inline]] __attribute__((target(MWMS_KERNELS_AVX2_TARGET))) static void store(
      std::uint16_t* p, Packed v) noexcept {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), v);
  }
  template <typename Op>
  [[gnu::always_inline]] __attribute__((target(MWMS_KERNELS_AVX2_TARGET))) static Packed combine(
      Packed a, Packed b) noexcept {
    const __m256 r = Vec256<Op>::apply(_mm256_cvtph_ps(a), _mm256_cvtph_ps(b));
    return _mm256_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT);
  }
  [[gnu::always_inline]] __attribute__((target(MWMS_KERNELS_AVX2_TARGET))) static Packed divide(
      Packed a, __m256 divisor) noexcept {
    return _mm256_cvtps_ph(_mm256_div_ps(_mm256_cvtph_ps(a), divisor), _MM_FROUND_TO_NEAREST_INT);
  }
};

// 16 bfloat16 per register (256 bits). Unpacking with zero puts each element in the upper half of
// a 32-bit lane, which makes it that lane's float32, in the order (0-3, 8-11) for lo and
// (4-7, 12-15) for hi, because AVX2 unpacks within 128-bit halves; packus_epi32(lo, hi) packs
// back in exactly that order, so no cross-lane shuffle is needed. Narrowing leaves every lane
// below 2^16, so packus's unsigned saturation never acts.
struct BFloat16Avx2 {
  static constexpr std::size_t kStep = 16;
  using Packed = __m256i;
  [[gnu::always_inline]] __attribute__((target(MWMS_KERNELS_AVX2_TARGET))) static Packed load(
      const std::uint16_t* p) noexcept {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
  [[gnu::always_inline]] __attribute__((target(MWMS_KERNELS_AVX2_TARGET))) static void store(
      std::uint16_t* p, Packed v) noexcept {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
  }
  [[gnu::always_inline]] __attribute__((target(MWMS_KERNELS_AVX2_TARGET))) static __m256 lo(
      Packed v) noexcept {
    return _mm256_castsi256_ps(_mm256_unpacklo_epi16(_mm256_setzero_si256(), v));
  }
  [[gnu::always_inline]] __attribute__((target(MWMS_KERNELS_AVX2_TARGET))) static __m256 hi(
      Packed v) noexcept {
    return _mm256_castsi256_ps(_mm256_unpackhi_epi16(_mm256_setzero_si256(), v));
  }
  // float_to_bfloat16_inline() per lane, the result in the lane's low 16 bits.
  [[gnu::always_inline]] __attribute__((target(MWMS_KERNELS_AVX2_TARGET))) static __m256i narrow(
      __m256 f) noexcept {
    const __m256i x = _mm256_castps_si256(f);
    const __m256i high = _mm256_srli_epi32(x, 16);
    const __m256i bias =
        _mm256_add_epi32(_mm256_and_si256(high, _mm256_set1_epi32(1)), _mm256_set1_epi32(0x7fff));
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(x, bias), 16);
    const __m256i nan = _mm256_or_si256(high, _mm256_set1_epi32(0x0040));
    const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(f, f, _CMP_UNORD_Q));
    return _mm256_blendv_epi8(rounded, nan, is_nan);
  }
  template <typename Op>
  [[gnu::always_inline]] __attribute__((target(MWMS_KERNELS_AVX2_TARGET))) static Packed combine(
      Packed a, Packed b) noexcept {
    return _mm256_packus_epi32(narrow(Vec256<Op>::apply(lo(a), lo(b))),
                               narrow(Vec256<Op>::apply(hi(a), hi(b))));
  }
  [[gnu::always_inline]] __attribute__((target(MWMS_KERNELS_AVX2_TARGET))) static Packed divide(
      Packed a, __m256 divisor) noexcept {
    return _mm256_packus_epi32(narrow(_mm256_div_ps(lo(a), divisor)),
                               narrow(_mm256_div_ps(hi(a), divisor)));
  }
};

// Not always_inline: called from the default-target reduce_16bit<> template (Note [isa
// variants]), which GCC will not let force-inline a target function; one call per buffer.
template <typename Codec>
struct Fused16Avx2 {
  template <typename Op>
  __attribute__((target(MWMS_KERNELS_AVX2_TARGET))) static void combine(
      std::uint16_t* dst, const std::uint16_t* src, std::size_t count) noexcept {
    constexpr std::size_t kStep = Codec::kStep;
    std::size_t i = 0;
    // Both inputs are loaded before dst is stored, so dst == src is safe.
    for (; i + kStep <= count; i += kStep) {
      Codec::store(dst + i,
                   Codec::template combine<Op>(Codec::load(dst + i), Codec::load(src + i)));
    }
    if (i == count) return;
    alignas(32) std::uint16_t a[kStep] = {};
    alignas(32) std::uint16_t b[kStep] = {};
    std::memcpy(a, dst + i, (count - i) * sizeof a[0]);
    std::memcpy(b, src + i, (count - i) * sizeof b[0]);
    Codec::store(a, Codec::template combine<Op>(Codec::load(a), Codec::load(b)));
    std::memcpy(dst + i, a, (count - i) * sizeof a[0]);
  }
  __attribute__((target(MWMS_KERNELS_AVX2_TARGET))) static void divide(std::uint16_t* buf,
                                                                       std::size_t count,
                                                                       float divisor) noexcept {
    constexpr std::size_t kStep = Codec::kStep;
    const __m256 d = _mm256_set1_ps(divisor);
    std::size_t i = 0;
    for (; i + kStep <= count; i += kStep) {
      Codec::store(buf + i, Codec::divide(Codec::load(buf + i), d));
    }
    if (i == count) return;
    alignas(32) std::uint16_t a[kStep] = {};
    std::memcpy(a, buf + i, (count - i) * sizeof a[0]);
    Codec::store(a, Codec::divide(Codec::load(a), d));
    std::memcpy(buf + i, a, (count - i) * sizeof a[0]);
  }
};

struct Avx2Isa {
  using Float16 = Fused16Avx2<HalfAvx2>;
  using BFloat16 = Fused16Avx2<BFloat16Avx2>;
};

// The target attribute sits on these internal functions, not on the entry points declared in
// reduce_impl.h: in C++ GCC reads declarations that differ in target() as multiversioned
// functions.
__attribute__((target(MWMS_KERNELS_AVX2_TARGET))) void reduce_avx2_target(
    void* dst, const void* src, std::size_t count, DataType dtype, ReduceOp op) noexcept {
  reduce_impl<Avx2Isa>(dst, src, count, dtype, op);
}

__attribute__((target(MWMS_KERNELS_AVX2_TARGET))) void scale_divide_avx2_target(
    void* buffer, std::size_t count, DataType dtype, int divisor) noexcept {
  scale_divide_impl<Avx2Isa>(buffer, count, dtype, divisor);
}

}  // namespace

void reduce_avx2(void* dst, const void* src, std::size_t count, DataType dtype,
                 ReduceOp op) noexcept {
  reduce_avx2_target(dst, src, count, dtype, op);
}

void scale_divide_avx2(void* buffer, std::size_t count, DataType dtype, int divisor) noexcept {
  scale_divide_avx2_target(buffer, count, dtype, divisor);
}

}  // namespace mwms::kernels::detail

#endif  // MWMS_KERNELS_X86
