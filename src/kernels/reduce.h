// CPU reduction kernels: the type-erased boundary (pointer, count, dtype, op) with templates
// inside. The CPU reducer is the reference the tests compare every other path against.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "mwms/types.h"

namespace mwms::kernels {

/// dst[i] = op(dst[i], src[i]) for i in [0, count). kMean reduces as kSum (the division happens
/// once, at the end, in scale_divide). float16/bfloat16: each pair is widened to float32, combined,
/// and rounded back once (round to nearest even). dst and src may not overlap partially
/// (dst == src is allowed); they need the element's alignment, nothing more. Never throws, never
/// allocates. Runs the best instruction-set variant this CPU has (detail::KernelIsa below).
///
/// NaN: for float types kMin and kMax propagate NaN (if either operand is NaN the result is NaN),
/// as torch.minimum/maximum do, unlike std::fmin/fmax which drop it; NCCL and MPI leave this
/// unspecified. Which of two NaN payloads survives is unspecified. min/max of +0 and -0 may return
/// either zero. kSum and kProd follow IEEE arithmetic.
/// Integers: kSum and kProd wrap modulo 2^N (two's complement, as unsigned arithmetic would; no
/// undefined behaviour on overflow); kMin/kMax compare as signed.
void reduce(void* dst, const void* src, std::size_t count, DataType dtype, ReduceOp op) noexcept;

/// buffer[i] = buffer[i] / divisor: float types divide in their own precision (float16/bfloat16 via
/// float32, rounded once); integers divide truncating toward zero (divisor -1 wraps the minimum
/// value like negation in unsigned arithmetic). Used for ReduceOp::kMean, with divisor = world
/// size. Precondition: divisor != 0. Never throws, never allocates.
void scale_divide(void* buffer, std::size_t count, DataType dtype, int divisor) noexcept;

/// IEEE binary16 <-> float32, round to nearest even, NaN/Inf/subnormals preserved. Values whose
/// magnitude rounds above 65504 become Inf. A NaN stays a NaN (sign and the payload bits that fit
/// are kept, the quiet bit is set), exactly as the x86 F16C instructions do, so the portable and
/// the hardware paths give identical bits.
float half_to_float(std::uint16_t h) noexcept;
std::uint16_t float_to_half(float f) noexcept;
/// bfloat16 <-> float32, round to nearest even, overflow to Inf, NaN kept a NaN (quiet bit set:
/// plain truncation would turn a NaN whose payload sits in the low 16 bits into Inf).
float bfloat16_to_float(std::uint16_t b) noexcept;
std::uint16_t float_to_bfloat16(float f) noexcept;

/// dst[i] = src[i] converted, for float32 -> float16/bfloat16 and back (`to` and `from` name the
/// 16-bit type; the conversions above, element by element). Gradient compression on the wire
/// (CommunicationOptions::compression). Never throws, never allocates; dst and src must not
/// overlap.
void float32_to_16(std::uint16_t* dst, const float* src, std::size_t count, DataType to) noexcept;
void float16_to_32(float* dst, const std::uint16_t* src, std::size_t count, DataType from) noexcept;

namespace detail {

/// Instruction-set variants of reduce() and scale_divide(), in increasing order of what they need
/// from the CPU. All give bit-identical results for every dtype and op, NaN propagation, signed
/// zeros and subnormals included; the one exception is the freedom reduce() documents (which
/// payload survives when both operands of a sum or product are NaN). They differ only in speed.
/// See Note [isa variants] in reduce_impl.h.
///  - kBaseline: x86-64 baseline (SSE2), or the portable code on other architectures.
///  - kAvx2: AVX2 + F16C: 256-bit loops, float16/bfloat16 converted in registers (fused loops).
///  - kAvx512: AVX-512 F/BW/VL/DQ + F16C: 512-bit loops, fused 16-bit loops with masked tails.
enum class KernelIsa : std::uint8_t { kBaseline = 0, kAvx2 = 1, kAvx512 = 2 };

/// Every KernelIsa, in increasing order (for tests and the bench to iterate over).
inline constexpr KernelIsa kAllKernelIsas[] = {KernelIsa::kBaseline, KernelIsa::kAvx2,
                                               KernelIsa::kAvx512};

/// "baseline", "avx2" or "avx512".
std::string_view to_string(KernelIsa isa) noexcept;

/// True when this CPU and OS can run `isa` (kBaseline: always). Detected once (CPUID, and the OS
/// saving the YMM/ZMM state), then cached; thread-safe.
bool kernel_isa_available(KernelIsa isa) noexcept;

/// The variant reduce() and scale_divide() run now: the best available one, or the one chosen by
/// force_kernel_isa(). Thread-safe.
KernelIsa active_kernel_isa() noexcept;

/// Test and bench hook: `isa` makes reduce() and scale_divide() run that variant, or the best
/// available one below it where this CPU lacks it (so check active_kernel_isa() afterwards);
/// std::nullopt restores the default (the best available). Process-wide (a relaxed atomic): a
/// reduce() running on another thread meanwhile may run either variant, with the same result.
void force_kernel_isa(std::optional<KernelIsa> isa) noexcept;

}  // namespace detail

}  // namespace mwms::kernels
