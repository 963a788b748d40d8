// CPU reduction kernels: the baseline variant, the public conversions, and the type-erased entry
// points that pick an ISA variant at run time (reduce_impl.h holds the loops every variant
// instantiates; reduce_avx2.cc and reduce_avx512.cc the SIMD variants).
#include "kernels/reduce.h"

#include <atomic>

#include "kernels/reduce_impl.h"

#if MWMS_KERNELS_X86
#include <cpuid.h>
#endif

namespace mwms::kernels {
namespace detail {

namespace {

// No intrinsics in the baseline: 16-bit types go through float32 blocks (Note [half blocks]).
struct BaselineIsa {
  using Float16 = Blocked16<HalfCodec>;
  using BFloat16 = Blocked16<BFloat16Codec>;
};

bool cpu_has_avx2_f16c() noexcept {
#if MWMS_KERNELS_X86
  // Function-local static: initialised once, thread-safe. __builtin_cpu_supports("avx2") also
  // checks that the OS saves the YMM state; F16C is read from CPUID directly because Clang's
  // builtin does not know the "f16c" name.
  static const bool has = [] {
    __builtin_cpu_init();
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
    return f16c && __builtin_cpu_supports("avx2");
  }();
  return has;
#else
  return false;
#endif
}

bool cpu_has_avx512() noexcept {
#if MWMS_KERNELS_X86
  // __builtin_cpu_supports reports AVX-512 features only when the OS saves the opmask and ZMM
  // state (XCR0), as "avx2" does for YMM. F, BW, VL and DQ come together on every AVX-512 CPU
  // since Skylake-SP; requiring all four keeps one variant instead of a matrix.
  static const bool has = [] {
    __builtin_cpu_init();
    return cpu_has_avx2_f16c() && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512dq");
  }();
  return has;
#else
  return false;
#endif
}

// The variants form a chain (AVX-512 implies AVX2 + F16C here), so "available" is "<= best".
KernelIsa best_isa() noexcept {
  static const KernelIsa best = cpu_has_avx512()     ? KernelIsa::kAvx512
                                : cpu_has_avx2_f16c() ? KernelIsa::kAvx2
                                                      : KernelIsa::kBaseline;
  return best;
}

// The KernelIsa set by force_kernel_isa(), or -1 for none (run the best available). Relaxed
// loads and stores suffice: it publishes no other data, and every variant gives the same bits.
std::atomic<int> g_forced_isa{-1};

}  // namespace

void reduce_baseline(void* dst, const void* src, std::size_t count, DataType dtype,
                     ReduceOp op) noexcept {
  reduce_impl<BaselineIsa>(dst, src, count, dtype, op);
}

void scale_divide_baseline(void* buffer, std::size_t count, DataType dtype, int divisor) noexcept {
  scale_divide_impl<BaselineIsa>(buffer, count, dtype, divisor);
}

std::string_view to_string(KernelIsa isa) noexcept {
  switch (isa) {
    case KernelIsa::kBaseline: return "baseline";
    case KernelIsa::kAvx2: return "avx2";
    case KernelIsa::kAvx512: return "avx512";
  }
  return "unknown";
}

bool kernel_isa_available(KernelIsa isa) noexcept {
  return static_cast<int>(isa) <= static_cast<int>(best_isa());
}

KernelIsa active_kernel_isa() noexcept {
  // A forced variant the CPU lacks falls back to the best available one (see reduce.h).
  const int forced = g_forced_isa.load(std::memory_order_relaxed);
  const KernelIsa best = best_isa();
  return forced >= 0 && forced < static_cast<int>(best) ? static_cast<KernelIsa>(forced) : best;
}

void force_kernel_isa(std::optional<KernelIsa> isa) noexcept {
  g_forced_isa.store(isa ? static_cast<int>(*isa) : -1, std::memory_order_relaxed);
}

}  // namespace detail

float half_to_float(std::uint16_t h) noexcept { return detail::half_to_float_inline(h); }
std::uint16_t float_to_half(float f) noexcept { return detail::float_to_half_inline(f); }
float bfloat16_to_float(std::uint16_t b) noexcept { return detail::bfloat16_to_float_inline(b); }
std::uint16_t float_to_bfloat16(float f) noexcept { return detail::float_to_bfloat16_inline(f); }

void reduce(void* dst, const void* src, std::size_t count, DataType dtype, ReduceOp op) noexcept {
  if (count == 0) return;
#if MWMS_KERNELS_X86
  switch (detail::active_kernel_isa()) {
    case detail::KernelIsa::kAvx512: detail::reduce_avx512(dst, src, count, dtype, op); return;
    case detail::KernelIsa::kAvx2: detail::reduce_avx2(dst, src, count, dtype, op); return;
    // Falls through to the baseline below: the one path every architecture compiles.
    case detail::KernelIsa::kBaseline: break;
  }
#endif
  detail::reduce_baseline(dst, src, count, dtype, op);
}

void scale_divide(void* buffer, std::size_t count, DataType dtype, int divisor) noexcept {
  // A mean over one rank (world size 1) is the sum itself: skip the pass over the buffer.
  if (count == 0 || divisor == 1) return;
#if MWMS_KERNELS_X86
  switch (detail::active_kernel_isa()) {
    case detail::KernelIsa::kAvx512:
      detail::scale_divide_avx512(buffer, count, dtype, divisor);
      return;
    case detail::KernelIsa::kAvx2: detail::scale_divide_avx2(buffer, count, dtype, divisor); return;
    case detail::KernelIsa::kBaseline: break;
  }
#endif
  detail::scale_divide_baseline(buffer, count, dtype, divisor);
}

void float32_to_16(std::uint16_t* dst, const float* src, std::size_t count, DataType to) noexcept {
  if (to == DataType::kBFloat16) {
    for (std::size_t i = 0; i < count; ++i) dst[i] = detail::float_to_bfloat16_inline(src[i]);
  } else {
    for (std::size_t i = 0; i < count; ++i) dst[i] = detail::float_to_half_inline(src[i]);
  }
}

void float16_to_32(float* dst, const std::uint16_t* src, std::size_t count, DataType from) noexcept {
  if (from == DataType::kBFloat16) {
    for (std::size_t i = 0; i < count; ++i) dst[i] = detail::bfloat16_to_float_inline(src[i]);
  } else {
    for (std::size_t i = 0; i < count; ++i) dst[i] = detail::half_to_float_inline(src[i]);
  }
}

}  // namespace mwms::kernels
