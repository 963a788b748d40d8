#include "common/verification.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace mwms::bench {

float half_to_float(std::uint16_t h) {
  const int exponent = (h >> 10) & 0x1f;
  const int mantissa = h & 0x3ff;
  float magnitude;
  if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -24);  // zero or subnormal
  } else if (exponent == 31) {
    magnitude = mantissa == 0 ? std::numeric_limits<float>::infinity()
                              : std::numeric_limits<float>::quiet_NaN();
  } else {
    magnitude = std::ldexp(static_cast<float>(mantissa | 0x400), exponent - 25);
  }
  return (h & 0x8000) ? -magnitude : magnitude;
}

std::uint16_t float_to_half(float f) {
  const std::uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const float a = std::fabs(f);
  if (std::isnan(a)) return sign | 0x7e00;
  if (a >= 65520.0f) return sign | 0x7c00;  // rounds to infinity
  if (a == 0.0f) return sign;
  int exp2 = 0;
  std::frexp(a, &exp2);  // a = m * 2^exp2, m in [0.5, 1)
  // Quantum of the target format at this magnitude: 2^(exp2-11) for normals, 2^-24 below 2^-14.
  const int quantum_exp = exp2 - 11 < -24 ? -24 : exp2 - 11;
  const float steps = std::nearbyint(std::ldexp(a, -quantum_exp));  // ties to even (default mode)
  const auto units = static_cast<std::uint32_t>(steps);
  // Below 2^-13 the encoding is the unit count itself (subnormals, and the first normal binade
  // whose exponent field 1 is exactly the carry out of the 10 mantissa bits).
  if (quantum_exp == -24) return sign | static_cast<std::uint16_t>(units);
  // units is in [1024, 2048]; 2048 means the rounding carried into the next binade.
  std::uint32_t biased = static_cast<std::uint32_t>(quantum_exp + 25);
  std::uint32_t m = units;
  if (m == 2048) {
    m = 1024;
    ++biased;
  }
  if (biased >= 31) return sign | 0x7c00;
  return sign | static_cast<std::uint16_t>((biased << 10) | (m & 0x3ff));
}

float bfloat16_to_float(std::uint16_t b) {
  std::uint32_t bits = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

std::uint16_t float_to_bfloat16(float f) {
  std::uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if (std::isnan(f)) return static_cast<std::uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fff + ((bits >> 16) & 1);  // round to nearest even on the dropped 16 bits
  return static_cast<std::uint16_t>(bits >> 16);
}

double load_element(const void* buffer, std::size_t i, DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32: return static_cast<const float*>(buffer)[i];
    case DataType::kFloat64: return static_cast<const double*>(buffer)[i];
    case DataType::kFloat16: return half_to_float(static_cast<const std::uint16_t*>(buffer)[i]);
    case DataType::kBFloat16:
      return bfloat16_to_float(static_cast<const std::uint16_t*>(buffer)[i]);
    case DataType::kInt32: return static_cast<const std::int32_t*>(buffer)[i];
    case DataType::kInt64: return static_cast<double>(static_cast<const std::int64_t*>(buffer)[i]);
  }
  return std::numeric_limits<double>::quiet_NaN();
}

void store_element(void* buffer, std::size_t i, DataType dtype, double value) {
  switch (dtype) {
    case DataType::kFloat32: static_cast<float*>(buffer)[i] = static_cast<float>(value); break;
    case DataType::kFloat64: static_cast<double*>(buffer)[i] = value; break;
    case DataType::kFloat16:
      static_cast<std::uint16_t*>(buffer)[i] = float_to_half(static_cast<float>(value));
      break;
    case DataType::kBFloat16:
      static_cast<std::uint16_t*>(buffer)[i] = float_to_bfloat16(static_cast<float>(value));
      break;
    case DataType::kInt32:
      static_cast<std::int32_t*>(buffer)[i] = static_cast<std::int32_t>(value);
      break;
    case DataType::kInt64:
      static_cast<std::int64_t*>(buffer)[i] = static_cast<std::int64_t>(value);
      break;
  }
}

void fill_input(const CollectiveDescriptor& collective, void* buffer, const CallShape& shape,
                DataType dtype) {
  const std::size_t elements = collective.buffer_count(shape.count, shape.world_size);
  for (std::size_t i = 0; i < elements; ++i) {
    store_element(buffer, i, dtype, collective.input_value(i, shape));
  }
}

void fill_constant(void* buffer, std::size_t count, DataType dtype, double value) {
  if (count == 0) return;
  store_element(buffer, 0, dtype, value);
  const std::size_t elem = dtype_size(dtype);
  auto* bytes = static_cast<unsigned char*>(buffer);
  for (std::size_t i = 1; i < count; ++i) std::memcpy(bytes + i * elem, bytes, elem);
}

std::int64_t count_wrong(const CollectiveDescriptor& collective, const void* buffer,
                         const CallShape& shape, DataType dtype) {
  std::int64_t wrong = 0;
  const auto [first, last] = collective.checked_range(shape);
  for (std::size_t i = first; i < last; ++i) {
    // Exact comparison on purpose: inputs are chosen so that the exact result is representable.
    if (load_element(buffer, i, dtype) != collective.expected_value(i, shape)) {
      ++wrong;
    }
  }
  return wrong;
}

double reduce_reference(double a, double b, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kMean: return a + b;
    case ReduceOp::kMin: return a < b ? a : b;
    case ReduceOp::kMax: return a > b ? a : b;
    case ReduceOp::kProd: return a * b;
  }
  return std::numeric_limits<double>::quiet_NaN();
}

// Small integers, so every partial sum/product/min/max is exact in every dtype, even float16
// (integers up to 2048) and bfloat16 (up to 256) for the rank counts a bench runs with:
//   sum:  (r + i) % 7                       -> at most 6n
//   mean: n * ((r + i) % 7)                 -> the sum is a multiple of n, the mean exact
//   prod: 2 when (r + i) % 3 == 0, else 1   -> a power of two, at most 2^ceil(n/3)
//   min/max: (r + i) % 7 - 3                -> negative values too
double reduction_input(std::size_t i, int rank, int world_size, ReduceOp op) {
  const auto k = static_cast<double>((i + static_cast<std::size_t>(rank)) % 7);
  switch (op) {
    case ReduceOp::kSum: return k;
    case ReduceOp::kMean: return world_size * k;
    case ReduceOp::kProd: return (i + static_cast<std::size_t>(rank)) % 3 == 0 ? 2.0 : 1.0;
    case ReduceOp::kMin:
    case ReduceOp::kMax: return k - 3;
  }
  return 0;
}

double reduction_expected(std::size_t i, int world_size, ReduceOp op) {
  double result = reduction_input(i, 0, world_size, op);
  for (int r = 1; r < world_size; ++r) {
    result = reduce_reference(result, reduction_input(i, r, world_size, op), op);
  }
  // The mean's sum is a multiple of n by construction, so the division is exact for integer
  // dtypes (truncating) and float dtypes alike.
  return op == ReduceOp::kMean ? result / world_size : result;
}

}  // namespace mwms::bench
