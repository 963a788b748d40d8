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
/// (dst == src is allowed). Never throws.
void reduce(void* dst, const void* src, std::size_t count, DataType dtype, ReduceOp op) noexcept;

/// buffer[i] = buffer[i] / divisor: float types divide in their own precision (float16/bfloat16 via
/// float32, rounded once); integers divide truncating toward zero. Used for ReduceOp::kMean.
void scale_divide(void* buffer, std::size_t count, DataType dtype, int divisor) noexcept;

/// IEEE binary16 <-> float32, round to nearest even, NaN/Inf/subnormals preserved.
float half_to_float(std::uint16_t h) noexcept;
std::uint16_t float_to_half(float f) noexcept;
/// bfloat16 <-> float32, round to nearest even, NaN kept quiet.
float bfloat16_to_float(std::uint16_t b) noexcept;
std::uint16_t float_to_bfloat16(float f) noexcept;

}  // namespace mwms::kernels
