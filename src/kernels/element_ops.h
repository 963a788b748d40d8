// Element operations of the reductions, written once for the CPU and the GPU: `__host__
// __device__` functors when nvcc compiles this header, plain inline functions for g++. The CUDA
// kernels (kernels/cuda/cuda_kernels.cu) apply them element by element; the CPU unit tests
// (tests/unit/kernels/element_ops_test.cc) check that they give the bits kernels::reduce and
// kernels::scale_divide give, so their logic is tested without a GPU.
//
// Note [gpu bit identity]: the GPU must reproduce the CPU path's bits, so these functions follow
// reduce_impl.h rule for rule: float16/bfloat16 are widened to float32, combined in float32 and
// rounded once back (round to nearest even, NaN kept a NaN with the quiet bit set, overflow to
// Inf), min/max propagate NaN, integer sum/prod wrap in the unsigned type and min/max compare as
// signed, the mean's division is one IEEE division in the element's precision (integers: truncate;
// -1 negates in unsigned arithmetic). The device side must not change the arithmetic either:
// kernels/cuda builds with -fmad=false (no contracted a * b + c), IEEE division and square root
// (nvcc's defaults -prec-div=true, -ftz=false: subnormals are kept, never flushed) and without
// --use_fast_math. The conversions are integer bit manipulations plus one float addition (the
// subnormal rounding trick of float_to_half), which CUDA performs in IEEE round-to-nearest-even
// like the CPU. Freedoms the CPU path documents (reduce.h: which NaN payload survives a sum of two
// NaNs, min/max of +0 and -0) and the bits of a NaN that a sum, product or division gives (the GPU
// has one canonical NaN, 0x7fffffff, where the CPU keeps an operand's sign and payload: Note
// [device NaN bits] in tests/support/element_cases.h) are the only places results may differ.
#pragma once

#include <cstdint>
#include <cstring>

#include "mwms/types.h"

#if defined(__CUDACC__)
#define MWMS_HD __host__ __device__ __forceinline__
#else
#define MWMS_HD inline
#endif

namespace mwms::kernels::ops {

MWMS_HD std::uint32_t bits_of(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

MWMS_HD float float_of(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

/// IEEE binary16 -> float32, exact (reduce.h half_to_float).
MWMS_HD float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t mant = h & 0x3ffu;
  std::uint32_t magnitude;
  if (exp == 0) {
    magnitude = bits_of(static_cast<float>(static_cast<std::int32_t>(mant)) * 0x1p-24f);
  } else if (exp == 31) {
    magnitude = 0x7f800000u | (mant << 13) | (mant != 0 ? 0x00400000u : 0u);
  } else {
    magnitude = ((exp + 112u) << 23) | (mant << 13);
  }
  return float_of(sign | magnitude);
}

/// float32 -> IEEE binary16, round to nearest even (reduce.h float_to_half).
MWMS_HD std::uint16_t float_to_half(float f) {
  const std::uint32_t x = bits_of(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::int32_t a = static_cast<std::int32_t>(x & 0x7fffffffu);
  std::uint32_t r;
  if (a > 0x7f800000) {
    r = 0x7e00u | ((static_cast<std::uint32_t>(a) >> 13) & 0x3ffu);  // NaN, quiet
  } else if (a >= 0x477ff000) {
    r = 0x7c00u;  // rounds above 65504: Inf
  } else if (a >= 0x38800000) {
    std::uint32_t n = static_cast<std::uint32_t>(a) - (112u << 23);
    r = (n + 0x0fffu + ((n >> 13) & 1u)) >> 13;
  } else {
    // Subnormal: the FPU's round to nearest even does the rounding (reduce_impl.h).
    r = bits_of(float_of(static_cast<std::uint32_t>(a)) + 0.5f) - 0x3f000000u;
  }
  return static_cast<std::uint16_t>(r | sign);
}

/// bfloat16 -> float32, exact.
MWMS_HD float bfloat16_to_float(std::uint16_t b) {
  return float_of(static_cast<std::uint32_t>(b) << 16);
}

/// float32 -> bfloat16, round to nearest even, NaN kept a NaN (quiet bit set).
MWMS_HD std::uint16_t float_to_bfloat16(float f) {
  const std::uint32_t x = bits_of(f);
  if (static_cast<std::int32_t>(x & 0x7fffffffu) > 0x7f800000) {
    return static_cast<std::uint16_t>((x >> 16) | 0x0040u);
  }
  return static_cast<std::uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

// ---- binary operators (on the computing type) ---------------------------------------------

struct Sum {
  template <typename T>
  MWMS_HD static T apply(T a, T b) { return a + b; }
};
struct Prod {
  template <typename T>
  MWMS_HD static T apply(T a, T b) { return a * b; }
};
struct Min {  // NaN propagates (reduce.h)
  template <typename T>
  MWMS_HD static T apply(T a, T b) { return (a < b || a != a) ? a : b; }
};
struct Max {
  template <typename T>
  MWMS_HD static T apply(T a, T b) { return (a > b || a != a) ? a : b; }
};

// ---- per-dtype element functors: storage in, storage out --------------------------------

/// dst = op(dst, src) on one element of a float32 / float64 buffer.
template <typename T, typename Op>
struct FloatReduce {
  using Storage = T;
  MWMS_HD T operator()(T a, T b) const { return Op::apply(a, b); }
};

/// One float16 element: widen, combine in float32, round once.
template <typename Op>
struct HalfReduce {
  using Storage = std::uint16_t;
  MWMS_HD std::uint16_t operator()(std::uint16_t a, std::uint16_t b) const {
    return float_to_half(Op::apply(half_to_float(a), half_to_float(b)));
  }
};

/// One bfloat16 element: widen, combine in float32, round once.
template <typename Op>
struct BFloat16Reduce {
  using Storage = std::uint16_t;
  MWMS_HD std::uint16_t operator()(std::uint16_t a, std::uint16_t b) const {
    return float_to_bfloat16(Op::apply(bfloat16_to_float(a), bfloat16_to_float(b)));
  }
};

/// Integers, stored as the unsigned type U: sum and prod wrap in U, min/max compare as S.
template <typename S, typename U, typename Op>
struct IntReduce {
  using Storage = U;
  MWMS_HD U operator()(U a, U b) const { return Op::apply(a, b); }
};
template <typename S, typename U>
struct IntReduce<S, U, Min> {
  using Storage = U;
  MWMS_HD U operator()(U a, U b) const {
    return static_cast<S>(a) < static_cast<S>(b) ? a : b;
  }
};
template <typename S, typename U>
struct IntReduce<S, U, Max> {
  using Storage = U;
  MWMS_HD U operator()(U a, U b) const {
    return static_cast<S>(a) > static_cast<S>(b) ? a : b;
  }
};

// ---- the mean's division (kernels::scale_divide) -----------------------------------------

template <typename T>
struct FloatScale {
  using Storage = T;
  T divisor;
  MWMS_HD T operator()(T x) const { return x / divisor; }
};
struct HalfScale {
  using Storage = std::uint16_t;
  float divisor;
  MWMS_HD std::uint16_t operator()(std::uint16_t x) const {
    return float_to_half(half_to_float(x) / divisor);
  }
};
struct BFloat16Scale {
  using Storage = std::uint16_t;
  float divisor;
  MWMS_HD std::uint16_t operator()(std::uint16_t x) const {
    return float_to_bfloat16(bfloat16_to_float(x) / divisor);
  }
};
/// Truncating integer division; -1 negates in U (INT_MIN / -1 would overflow).
template <typename S, typename U>
struct IntScale {
  using Storage = U;
  S divisor;
  MWMS_HD U operator()(U x) const {
    return divisor == -1 ? static_cast<U>(U{0} - x)
                         : static_cast<U>(static_cast<S>(x) / divisor);
  }
};

/// Calls `f(functor)` with the element functor of (dtype, op): kMean reduces as kSum. The
/// functor's Storage type is the element's storage (uint16 for the 16-bit floats, the unsigned
/// type for integers). Host code only (it picks what a kernel is instantiated with).
template <typename F>
inline void with_reduce_functor(DataType dtype, ReduceOp op, F&& f) {
  auto by_op = [&](auto make) {
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kMean: f(make(Sum{})); return;
      case ReduceOp::kProd: f(make(Prod{})); return;
      case ReduceOp::kMin: f(make(Min{})); return;
      case ReduceOp::kMax: f(make(Max{})); return;
    }
  };
  switch (dtype) {
    case DataType::kFloat32: by_op([](auto o) { return FloatReduce<float, decltype(o)>{}; }); return;
    case DataType::kFloat64: by_op([](auto o) { return FloatReduce<double, decltype(o)>{}; }); return;
    case DataType::kFloat16: by_op([](auto o) { return HalfReduce<decltype(o)>{}; }); return;
    case DataType::kBFloat16: by_op([](auto o) { return BFloat16Reduce<decltype(o)>{}; }); return;
    case DataType::kInt32:
      by_op([](auto o) { return IntReduce<std::int32_t, std::uint32_t, decltype(o)>{}; });
      return;
    case DataType::kInt64:
      by_op([](auto o) { return IntReduce<std::int64_t, std::uint64_t, decltype(o)>{}; });
      return;
  }
}

/// True when dividing by `divisor` must leave the buffer untouched, as kernels::scale_divide does
/// (it returns early for 1: a signalling NaN stays signalling, where x / 1 would quiet it).
inline bool scale_is_identity(int divisor) { return divisor == 1; }

/// Calls `f(functor)` with the division functor of `dtype` for `divisor` (precondition != 0;
/// callers skip the call where scale_is_identity(divisor)). Host code only.
template <typename F>
inline void with_scale_functor(DataType dtype, int divisor, F&& f) {
  switch (dtype) {
    case DataType::kFloat32: f(FloatScale<float>{static_cast<float>(divisor)}); return;
    case DataType::kFloat64: f(FloatScale<double>{static_cast<double>(divisor)}); return;
    case DataType::kFloat16: f(HalfScale{static_cast<float>(divisor)}); return;
    case DataType::kBFloat16: f(BFloat16Scale{static_cast<float>(divisor)}); return;
    case DataType::kInt32: f(IntScale<std::int32_t, std::uint32_t>{divisor}); return;
    case DataType::kInt64: f(IntScale<std::int64_t, std::uint64_t>{divisor}); return;
  }
}

}  // namespace mwms::kernels::ops
