// The AVX-512 variant of the CPU reduction kernels (Note [isa variants] in reduce_impl.h):
// float32/float64/integer loops auto-vectorised for 512-bit registers (DQ's vpmullq makes int64
// prod vector code too), float16/bfloat16 through fused loops (Note [fused 16-bit] in
// reduce_avx2.cc) whose tails use masked loads and stores (BW + VL), so no element takes a
// scalar path and nothing outside [0, count) is touched. Every helper has the target attribute:
// GCC refuses to inline AVX-512 intrinsics into a function without it.
//
// Frequency: 512-bit float instructions lower the clock of some Intel server parts (Skylake-SP,
// Cascade Lake). These loops are memory-bound at the sizes the all-reduce reduces (~256 KiB
// chunks), so the variant is used wherever it is available; reduce_kernel_perf prints it beside
// the AVX2 variant, which is where a slowdown would show.
#include "kernels/reduce_impl.h"

#if MWMS_KERNELS_X86

#include <immintrin.h>

// DQ for vpmullq; F16C and AVX2 so the helpers may use their 256-bit forms. No "fma": nothing
// needs it, and -ffp-contract=off keeps the compiler from forming FMAs anyway (reduce_impl.h).
#define MWMS_KERNELS_AVX512_TARGET "avx512f,avx512bw,avx512vl,avx512dq,avx2,f16c"

// GCC 12 flags 512-bit intrinsics whose pass-through source is _mm512_undefined_*() as
// maybe-uninitialized once inlined (GCC bug 105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace mwms::kernels::detail {
namespace {

// The element functors on 16 float32 lanes, selecting exactly as MinOp/MaxOp do (a if a < b or
// a is NaN, else b), like Vec256 in reduce_avx2.cc.
template <typename Op>
struct Vec512;
template <>
struct Vec512<SumOp> {
  [[gnu::always_inline]] __attribute__((target(MWMS_KERNELS_AVX512_TARGET))) static __m512 apply(
      __m512 a, __m512 b) noexcept {
    return _mm512_add_ps(a, b);
  }
};
template <>
struct Vec512<ProdOp> {
  [[gnu::always_inline]] __attribute__((target(MWMS_KERNELS_AVX512_TARGET))) static __m512 apply(
      __m512 a, __m512 b) noexcept {
    return _mm512_mul_ps(a, b);
  }
};
template <>
struct Vec512<MinOp> {
  [[gnu::always_inline]] __attribute__((target(MWMS_KERNELS_AVX512_TARGET))) static __m512 apply(
      __m512 a, __m512 b) noexcept {
    const __mmask16 take_a = static_cast<__mmask16>(_mm512_cmp_ps_mask(a, b, _CMP_LT_OQ) |
                                                    _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q));
    return _mm512_mask_blend_ps(take_a, b, a);
  }
};
template <>
struct Vec512<MaxOp> {
  [[gnu::always_inline]] __attribute__((target(MWMS_KERNELS_AVX512_TARGET))) static __m512 apply(
      __m512 a, __m512 b) noexcept {
    const __mmask16 take_a = static_cast<__mmask16>(_mm512_cmp_ps_mask(a, b, _CMP_GT_OQ) |
                                                    _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q));
    return _mm512_mask_blend_ps(take_a, b, a);
  }
};

// 16 float16 per register (256 bits), widened to 16 float32 lanes by the 512-bit forms of the
// F16C conversions (same rounding and NaN rules).
struct HalfAvx512 {
  static constexpr std::size_t kStep = 16;
  using Packed = __m256i;
  using Mask = __mmask16;
  [[gnu::always_inline]] __attribute__((target(MWMS_KERNELS_AVX512_TARGET))) static Packed load(
      const std::uint16_t* p) noexcept {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
  [[gnu::always_inline]] __attribute__((target(MWMS_KERNELS_AVX512_TARGET))) static void store(
      std::uint16_t* p, Packed v) noexcept {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
  }
  [[gnu::always_inline]] __attribute__((target(MWMS_KERNELS_AVX512_TARGET))) static Packed
  load_masked(const std::uint16_t* p, Mask m) noexcept {
    return _mm256_maskz_loadu_epi16(m, p);
  }
  [[gnu::always_inline]] __attribute__((target(MWMS_KERNELS_AVX512_TARGET))) static void
  store_masked(std::uint16_t* p, Mask m, Packed v) noexcept {
    _mm256_mask_storeu_epi16(p, m, v);
  }
  template <typename Op>
  [[gnu::always_inline]] __attribute__((target(MWMS_KERNELS_AVX512_TARGET))) static Packed combine(
      Packed a, Packed b) noexcept {
    const __m512 r = Vec512<Op>::apply(_mm512_cvtph_ps(a), _mm512_cvtph_ps(b));
    return _mm512_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT);
  }
  [[gnu::always_inline]] __attribute__((target(MWMS_KERNELS_AVX512_TARGET))) static Packed divide(
      Packed a, __m512 divisor) noexcept {
    return _mm512_cvtps_ph(_mm512_div_ps(_mm512_cvtph_ps(a), divisor), _MM_FROUND_TO_NEAREST_INT);
  }
};

// 32 bfloat16 per register (512 bits), unpacked with zero into two float32 registers and packed
// back with packus, as BFloat16Avx2 does: the AVX-512 forms also work within 128-bit lanes, so
// the element order survives the round trip.
struct BFloat16Avx512 {
  static constexpr std::size_t kStep = 32;
  using Packed = __m512i;
  using Mask = __mmask32;
  [[gnu::always_inline]] __attribute__((target(MWMS_KERNELS_AVX512_TARGET))) static Packed load(
      const std::uint16_t* p) noexcept {
    return _mm512_loadu_si512(p);
  }
  [[gnu::always_inline]] __attribute__((target(MWMS_KERNELS_AVX512_TARGET))) static void store(
      std::uint16_t* p, Packed v) noexcept {
    _mm512_storeu_si512(p, v);
  }
  [[gnu::always_inline]] __attribute__((target(MWMS_KERNELS_AVX512_TARGET))) static Packed
  load_masked(const std::uint16_t* p, Mask m) noexcept {
    return _mm512_maskz_loadu_epi16(m, p);
  }
  [[gnu::always_inline]] __attribute__((target(MWMS_KERNELS_AVX512_TARGET))) static void
  store_masked(std::uint16_t* p, Mask m, Packed v) noexcept {
    _mm512_mask_storeu_epi16(p, m, v);
  }
  [[gnu::always_inline]] __attribute__((target(MWMS_KERNELS_AVX512_TARGET))) static __m512 lo(
      Packed v) noexcept {
    return _mm512_castsi512_ps(_mm512_unpacklo_epi16(_mm512_setzero_si512(), v));
  }
  [[gnu::always_inline]] __attribute__((target(MWMS_KERNELS_AVX512_TARGET))) static __m512 hi(
      Packed v) noexcept {
    return _mm512_castsi512_ps(_mm512_unpackhi_epi16(_mm512_setzero_si512(), v));
  }
  // float_to_bfloat16_inline() per lane, the result in the lane's low 16 bits.
  [[gnu::always_inline]] __attribute__((target(MWMS_KERNELS_AVX512_TARGET))) static __m512i narrow(
      __m512 f) noexcept {
    const __m512i x = _mm512_castps_si512(f);
    const __m512i high = _mm512_srli_epi32(x, 16);
    const __m512i bias =
        _mm512_add_epi32(_mm512_and_si512(high, _mm512_set1_epi32(1)), _mm512_set1_epi32(0x7fff));
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(x, bias), 16);
    const __m512i nan = _mm512_or_si512(high, _mm512_set1_epi32(0x0040));
    const __mmask16 is_nan = _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q);
    return _mm512_mask_blend_epi32(is_nan, rounded, nan);
  }
  template <typename Op>
  [[gnu::always_inline]] __attribute__((target(MWMS_KERNELS_AVX512_TARGET))) static Packed combine(
      Packed a, Packed b) noexcept {
    return _mm512_packus_epi32(narrow(Vec512<Op>::apply(lo(a), lo(b))),
                               narrow(Vec512<Op>::apply(hi(a), hi(b))));
  }
  [[gnu::always_inline]] __attribute__((target(MWMS_KERNELS_AVX512_TARGET))) static Packed divide(
      Packed a, __m512 divisor) noexcept {
    return _mm512_packus_epi32(narrow(_mm512_div_ps(lo(a), divisor)),
                               narrow(_mm512_div_ps(hi(a), divisor)));
  }
};

// Lanes [0, n) of a register, n < 32.
template <typename Mask>
[[gnu::always_inline]] __attribute__((target(MWMS_KERNELS_AVX512_TARGET))) inline Mask lanes(
    std::size_t n) noexcept {
  return static_cast<Mask>((1u << n) - 1u);
}

// Not always_inline, for the reason given at Fused16Avx2.
template <typename Codec>
struct Fused16Avx512 {
  template <typename Op>
  __attribute__((target(MWMS_KERNELS_AVX512_TARGET))) static void combine(
      std::uint16_t* dst, const std::uint16_t* src, std::size_t count) noexcept {
    std::size_t i = 0;
    // Both inputs are loaded before dst is stored, so dst == src is safe.
    for (; i + Codec::kStep <= count; i += Codec::kStep) {
      Codec::store(dst + i,
                   Codec::template combine<Op>(Codec::load(dst + i), Codec::load(src + i)));
    }
    if (i == count) return;
    // Masked-off lanes read as zero and are never written.
    const auto m = lanes<typename Codec::Mask>(count - i);
    Codec::store_masked(dst + i, m,
                        Codec::template combine<Op>(Codec::load_masked(dst + i, m),
                                                    Codec::load_masked(src + i, m)));
  }
  __attribute__((target(MWMS_KERNELS_AVX512_TARGET))) static void divide(std::uint16_t* buf,
                                                                         std::size_t count,
                                                                         float divisor) noexcept {
    const __m512 d = _mm512_set1_ps(divisor);
    std::size_t i = 0;
    for (; i + Codec::kStep <= count; i += Codec::kStep) {
      Codec::store(buf + i, Codec::divide(Codec::load(buf + i), d));
    }
    if (i == count) return;
    const auto m = lanes<typename Codec::Mask>(count - i);
    Codec::store_masked(buf + i, m, Codec::divide(Codec::load_masked(buf + i, m), d));
  }
};

struct Avx512Isa {
  using Float16 = Fused16Avx512<HalfAvx512>;
  using BFloat16 = Fused16Avx512<BFloat16Avx512>;
};

// Target attributes on internal functions only, as in reduce_avx2.cc.
__attribute__((target(MWMS_KERNELS_AVX512_TARGET))) void reduce_avx512_target(
    void* dst, const void* src, std::size_t count, DataType dtype, ReduceOp op) noexcept {
  reduce_impl<Avx512Isa>(dst, src, count, dtype, op);
}

__attribute__((target(MWMS_KERNELS_AVX512_TARGET))) void scale_divide_avx512_target(
    void* buffer, std::size_t count, DataType dtype, int divisor) noexcept {
  scale_divide_impl<Avx512Isa>(buffer, count, dtype, divisor);
}

}  // namespace

void reduce_avx512(void* dst, const void* src, std::size_t count, DataType dtype,
                   ReduceOp op) noexcept {
  reduce_avx512_target(dst, src, count, dtype, op);
}

void scale_divide_avx512(void* buffer, std::size_t count, DataType dtype, int divisor) noexcept {
  scale_divide_avx512_target(buffer, count, dtype, divisor);
}

}  // namespace mwms::kernels::detail

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#endif  // MWMS_KERNELS_X86
