// Exact test values shared by the collective tests (nccl-tests verifiable/ idea): inputs are
// small integers, so sums, products, minima and maxima are exact in every dtype (bfloat16 holds
// integers up to 256 exactly), and results compare for equality.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/reduce.h"
#include "mwms/types.h"

namespace mwms::testing {

/// Input of rank r at element i: in [-5, 5] (in [1, 3] for prod, so 4 ranks stay <= 81).
inline double input_value(int r, std::size_t i, ReduceOp op) {
  if (op == ReduceOp::kProd) return static_cast<double>((static_cast<std::size_t>(r) + i) % 3 + 1);
  return static_cast<double>((static_cast<std::size_t>(r) * 7 + i * 3) % 11) - 5.0;
}

/// Element i of a `t` buffer from a double (exact for the values above).
inline void store(DataType t, void* base, std::size_t i, double v) {
  switch (t) {
    case DataType::kFloat32: static_cast<float*>(base)[i] = static_cast<float>(v); return;
    case DataType::kFloat64: static_cast<double*>(base)[i] = v; return;
    case DataType::kFloat16:
      static_cast<std::uint16_t*>(base)[i] = kernels::float_to_half(static_cast<float>(v));
      return;
    case DataType::kBFloat16:
      static_cast<std::uint16_t*>(base)[i] = kernels::float_to_bfloat16(static_cast<float>(v));
      return;
    case DataType::kInt32: static_cast<std::int32_t*>(base)[i] = static_cast<std::int32_t>(v); return;
    case DataType::kInt64: static_cast<std::int64_t*>(base)[i] = static_cast<std::int64_t>(v); return;
  }
}

/// Element i of a `t` buffer as a double.
inline double load(DataType t, const void* base, std::size_t i) {
  switch (t) {
    case DataType::kFloat32: return static_cast<const float*>(base)[i];
    case DataType::kFloat64: return static_cast<const double*>(base)[i];
    case DataType::kFloat16: return kernels::half_to_float(static_cast<const std::uint16_t*>(base)[i]);
    case DataType::kBFloat16:
      return kernels::bfloat16_to_float(static_cast<const std::uint16_t*>(base)[i]);
    case DataType::kInt32: return static_cast<const std::int32_t*>(base)[i];
    case DataType::kInt64: return static_cast<double>(static_cast<const std::int64_t*>(base)[i]);
  }
  return 0;
}

}  // namespace mwms::testing
