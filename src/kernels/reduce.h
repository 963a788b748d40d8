// CPU reduction kernels: the type-erased boundary (pointer, count, dtype, op) with templates
// inside. The CPU reducer is the reference the tests compare every other path against.
#pragma once

#include <cstddef>
#include <cstdint>

#include "mwms/types.h"

namespace mwms::kernels {

/// dst[i] = op(dst[i], src[i]) for i in [0, count). kMean reduces as kSum (the division happens
/// once, at the end, in scale_divide). float16/bfloat16: each pair is widened to float32, combined,
/// and rounded back once (round to nearest even). dst and src may not overlap partially
/// (dst == src is allowed). Never throws, never allocates.
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

namespace detail {

/// True when this CPU has AVX2 and F16C, so reduce() and scale_divide() run the AVX2 variant
/// (float16 conversions in hardware). Results are bit-identical to the baseline variant.
bool avx2_kernels_available() noexcept;

/// Test and bench hook: true makes reduce() and scale_divide() run the baseline x86-64 (SSE2)
/// variant even where AVX2 is available, so tests can compare the two. Process-wide, relaxed.
void force_baseline_kernels(bool force) noexcept;

}  // namespace detail

}  // namespace mwms::kernels
