// Exact test values shared by the collective tests (nccl-tests verifiable/ idea): inputs are
// small integers, so sums, products, minima and maxima are exact in every dtype (bfloat16 holds
// integers up to 256 exactly), and results compare for equality.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <sstream>
#include <string>

#include "kernels/reduce.h"
#include "mwms/types.h"

namespace mwms::testing {

/// Every dtype and every reduce op, for loops over all of them.
inline constexpr DataType kAllDtypes[] = {DataType::kFloat32,  DataType::kFloat64,
                                          DataType::kFloat16,  DataType::kBFloat16,
                                          DataType::kInt32,    DataType::kInt64};
inline constexpr ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMin,
                                       ReduceOp::kMax, ReduceOp::kProd};

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

/// What element i holds after an all-reduce with `op` of input_value() over ranks 0..n-1 in a `t`
/// buffer: exact for sum, min, max and prod; kMean as the library divides (integers truncate,
/// float32 divides in float).
inline double reduced_value(int n, std::size_t i, DataType t, ReduceOp op) {
  double acc = input_value(0, i, op);
  for (int r = 1; r < n; ++r) {
    const double v = input_value(r, i, op);
    if (op == ReduceOp::kSum || op == ReduceOp::kMean) acc += v;
    if (op == ReduceOp::kMin) acc = std::min(acc, v);
    if (op == ReduceOp::kMax) acc = std::max(acc, v);
    if (op == ReduceOp::kProd) acc *= v;
  }
  if (op != ReduceOp::kMean) return acc;
  if (t == DataType::kInt32 || t == DataType::kInt64) return std::trunc(acc / n);
  if (t == DataType::kFloat32) return static_cast<float>(acc) / static_cast<float>(n);
  return acc / n;
}

/// Whether `got` is reduced_value()'s `want`: equal, except that a float16/bfloat16 mean may be
/// one unit in the last place off (it is rounded to the type after the division).
inline bool close_enough(double got, double want, DataType t, ReduceOp op) {
  if (got == want) return true;
  if (op != ReduceOp::kMean) return false;
  const double ulp = t == DataType::kFloat16    ? std::ldexp(1.0, -10)
                     : t == DataType::kBFloat16 ? std::ldexp(1.0, -7)
                                                : 0;
  return std::fabs(got - want) <= ulp * std::max(1.0, std::fabs(want));
}

/// The first of the `count` elements of the `t` buffer `buf` that is not close_enough() to
/// want(i), as a message naming `what`, the dtype, op, count, index and both values; "" when
/// every element is. Touches nothing shared (callable from any thread or forked rank).
inline std::string first_mismatch(const char* what, DataType t, ReduceOp op, const void* buf,
                                  std::size_t count, const std::function<double(std::size_t)>& want) {
  for (std::size_t i = 0; i < count; ++i) {
    const double got = load(t, buf, i);
    if (!close_enough(got, want(i), t, op)) {
      std::ostringstream msg;
      msg << what << " " << to_string(t) << " " << to_string(op) << " count " << count
          << ": element " << i << " is " << got << ", expected " << want(i);
      return msg.str();
    }
  }
  return "";
}

}  // namespace mwms::testing
