// Operand pairs for bit-exact kernel comparisons (the CPU kernels vs the element functors of
// kernels/element_ops.h in tests/unit, vs the CUDA kernels in tests/cuda): every pair of a list of
// edge values (zeros of both signs, subnormals, the extremes, Inf, quiet and signalling NaNs with
// payloads in either half, integer limits) and pseudo-random bit patterns; for float16 and
// bfloat16 every one of the 65536 bit patterns meets every edge value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <vector>

#include "kernels/reduce.h"
#include "mwms/types.h"
#include "support/values.h"  // kAllDtypes, kAllOps

namespace mwms::testing {

/// A host buffer of `count` elements of one dtype, read and written as raw bits.
class BitBuffer {
 public:
  BitBuffer(DataType dt, std::size_t count) : dt_(dt), size_(dtype_size(dt)), bytes_(count * size_) {}
  DataType dtype() const { return dt_; }
  std::size_t count() const { return bytes_.size() / size_; }
  std::size_t bytes() const { return bytes_.size(); }
  void* data() { return bytes_.data(); }
  const void* data() const { return bytes_.data(); }
  std::uint64_t get(std::size_t i) const {
    std::uint64_t v = 0;
    std::memcpy(&v, bytes_.data() + i * size_, size_);  // little-endian
    return v;
  }
  void set(std::size_t i, std::uint64_t v) { std::memcpy(bytes_.data() + i * size_, &v, size_); }

 private:
  DataType dt_;
  std::size_t size_;
  std::vector<unsigned char> bytes_;
};

/// True when `bits` is a NaN of a float dtype (never for integers).
inline bool is_nan_bits(DataType dt, std::uint64_t bits) {
  switch (dt) {
    case DataType::kFloat32: return (bits & 0x7fffffffu) > 0x7f800000u;
    case DataType::kFloat64: return (bits & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
    case DataType::kFloat16: return (bits & 0x7fffu) > 0x7c00u;
    case DataType::kBFloat16: return (bits & 0x7fffu) > 0x7f80u;
    default: return false;
  }
}

/// Edge values of `dt`, as bits.
inline std::vector<std::uint64_t> edge_bits(DataType dt) {
  switch (dt) {
    case DataType::kFloat32:
      return {0x00000000, 0x80000000, 0x3f800000, 0xbf800000, 0x00000001, 0x807fffff, 0x00800000,
              0x7f7fffff, 0xff7fffff, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00001, 0x7f800001,
              0x7fa00000, 0x33800000, 0x387fc000, 0x38800000, 0x477fe000, 0x477ff000, 0x40490fdb,
              0x3eaaaaab, 0x4b800001, 0xcb7fffff};
    case DataType::kFloat64:
      return {0x0ull, 0x8000000000000000ull, 0x3ff0000000000000ull, 0xbff0000000000000ull, 0x1ull,
              0x800fffffffffffffull, 0x0010000000000000ull, 0x7fefffffffffffffull,
              0x7ff0000000000000ull, 0xfff0000000000000ull, 0x7ff8000000000000ull,
              0xfff8000000000001ull, 0x7ff0000000000001ull, 0x400921fb54442d18ull,
              0x3fd5555555555555ull, 0x4340000000000001ull};
    case DataType::kFloat16:
      return {0x0000, 0x8000, 0x3c00, 0xbc00, 0x0001, 0x83ff, 0x0400, 0x7bff, 0xfbff, 0x7c00,
              0xfc00, 0x7e00, 0xfe01, 0x7c01, 0x3555, 0x4248, 0x6400, 0x1400};
    case DataType::kBFloat16:
      return {0x0000, 0x8000, 0x3f80, 0xbf80, 0x0001, 0x807f, 0x0080, 0x7f7f, 0xff7f, 0x7f80,
              0xff80, 0x7fc0, 0xffc1, 0x7f81, 0x3eab, 0x4049, 0x4b80, 0x0c00};
    case DataType::kInt32:
      return {0, 1, 0xffffffffu, 0x7fffffffu, 0x80000000u, 0x80000001u, 2, 0xfffffffeu, 0x10000,
              12345, 0xffff0000u};
    case DataType::kInt64:
      return {0, 1, ~0ull, 0x7fffffffffffffffull, 0x8000000000000000ull, 0x8000000000000001ull, 2,
              0xfffffffffffffffeull, 0x100000000ull, 12345, 0xffffffff00000000ull};
  }
  return {};
}

/// Operands a (dst) and b (src): every pair of edge values and pseudo-random patterns; for the
/// 16-bit floats every bit pattern against every edge value.
inline void operand_pairs(DataType dt, BitBuffer* a_out, BitBuffer* b_out) {
  std::vector<std::uint64_t> edges = edge_bits(dt);
  std::vector<std::uint64_t> as, bs;
  const std::size_t size = dtype_size(dt);
  const std::uint64_t mask = size == 8 ? ~0ull : (1ull << (8 * size)) - 1;
  if (size == 2) {
    for (std::uint64_t x = 0; x < 65536; ++x) {
      for (std::uint64_t e : edges) {
        as.push_back(x);
        bs.push_back(e);
      }
    }
  } else {
    std::vector<std::uint64_t> values = edges;
    std::uint64_t s = 0x243f6a8885a308d3ull;
    for (int i = 0; i < 200; ++i) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      values.push_back((s >> 7) & mask);
    }
    for (std::uint64_t x : values) {
      for (std::uint64_t y : values) {
        as.push_back(x);
        bs.push_back(y);
      }
    }
  }
  *a_out = BitBuffer(dt, as.size());
  *b_out = BitBuffer(dt, bs.size());
  for (std::size_t i = 0; i < as.size(); ++i) {
    a_out->set(i, as[i]);
    b_out->set(i, bs[i]);
  }
}

// Note [device NaN bits]: NVIDIA GPUs do not propagate NaN payloads: a float32 addition,
// multiplication or division whose result is NaN (a NaN operand, Inf - Inf, 0 x Inf) gives the
// one canonical NaN 0x7fffffff (float16/bfloat16 are computed in float32, so theirs is
// float_to_half of it, 0x7fff; float64 is held to the same rule), where the x86 CPU keeps the NaN
// operand's sign and payload (quieted) or gives its default NaN 0xffc00000. Neither is a bug:
// IEEE 754 only recommends payload propagation, and NaN sign and payload are not a value the
// library promises across devices. So the device kernels are compared with the CPU's bits
// everywhere except there: where the CPU's sum, product (or mean division) is a NaN, any NaN is
// right on the device (NanMatch::kAnyNan). Min and max select an operand, with its bits, on
// both: compared exactly.

/// What count_mismatches requires of a NaN result of a sum or product (Note [device NaN bits]).
enum class NanMatch {
  kCpuBits,  ///< the CPU's bits, but any NaN where both operands are NaN (reduce.h's freedom)
  kAnyNan,   ///< the device against the CPU: any NaN wherever the CPU's result is a NaN
};

/// Elements i where `got` differs from `want`, allowing the one freedom kernels::reduce documents:
/// when both operands a[i] and b[i] of a sum or product are NaN, any NaN is right; with `nan`
/// kAnyNan (a device result against the CPU's), any NaN is right wherever `want` of a sum or
/// product is a NaN. min/max are compared bit for bit either way.
inline std::size_t count_mismatches(ReduceOp op, const BitBuffer& a, const BitBuffer& b,
                                    const BitBuffer& want, const BitBuffer& got,
                                    NanMatch nan = NanMatch::kCpuBits) {
  const DataType dt = want.dtype();
  const bool arithmetic = op != ReduceOp::kMin && op != ReduceOp::kMax;
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < want.count(); ++i) {
    const bool any_nan = nan == NanMatch::kAnyNan ? is_nan_bits(dt, want.get(i))
                                                  : is_nan_bits(dt, a.get(i)) &&
                                                        is_nan_bits(dt, b.get(i));
    if (arithmetic && any_nan) {
      wrong += !is_nan_bits(dt, got.get(i));
    } else {
      wrong += got.get(i) != want.get(i);
    }
  }
  return wrong;
}

/// One bit-exact reduce comparison: operands `a` (dst) and `b` (src) of `dtype` from
/// operand_pairs, and `want` = kernels::reduce(a, b, op), the CPU oracle.
struct ReduceCase {
  DataType dtype;
  ReduceOp op;
  const BitBuffer& a;
  const BitBuffer& b;
  const BitBuffer& want;
};

/// Calls `check(const ReduceCase&)` for every dtype x op (dtypes outer); the caller computes its
/// own result from `a` and `b` and compares it with count_mismatches(op, a, b, want, got).
template <class Check>
void for_each_reduce_case(Check&& check) {
  for (DataType dt : kAllDtypes) {
    BitBuffer a(dt, 0), b(dt, 0);
    operand_pairs(dt, &a, &b);
    for (ReduceOp op : kAllOps) {
      BitBuffer want = a;
      kernels::reduce(want.data(), b.data(), want.count(), dt, op);
      check(ReduceCase{dt, op, a, b, want});
    }
  }
}

/// One bit-exact mean division: `a` of `dtype` (the dst operands of operand_pairs) and `want` =
/// kernels::scale_divide(a, divisor), the CPU oracle. Compare with
/// count_mismatches(ReduceOp::kMin, a, a, want, got): exact bits, NaNs included (on a device:
/// ReduceOp::kSum and NanMatch::kAnyNan for divisors other than 1, Note [device NaN bits]).
struct ScaleCase {
  DataType dtype;
  int divisor;
  const BitBuffer& a;
  const BitBuffer& want;
};

/// Calls `check(const ScaleCase&)` for every dtype x each of `divisors` (dtypes outer).
template <class Check>
void for_each_scale_case(std::initializer_list<int> divisors, Check&& check) {
  for (DataType dt : kAllDtypes) {
    BitBuffer a(dt, 0), unused(dt, 0);
    operand_pairs(dt, &a, &unused);
    for (int divisor : divisors) {
      BitBuffer want = a;
      kernels::scale_divide(want.data(), want.count(), dt, divisor);
      check(ScaleCase{dt, divisor, a, want});
    }
  }
}

}  // namespace mwms::testing
