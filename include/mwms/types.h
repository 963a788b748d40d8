/// @file types.h
/// Element types and reduction operators understood by every libmwms collective.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "mwms/api.h"

namespace mwms {

/// Element type of a collective buffer. Sizes in bytes: float32 4, float64 8, float16 2 (IEEE
/// binary16), bfloat16 2 (upper half of a float32), int32 4, int64 8.
enum class DataType : std::uint8_t {
  kFloat32 = 0,
  kFloat64 = 1,
  kFloat16 = 2,
  kBFloat16 = 3,
  kInt32 = 4,
  kInt64 = 5,
};

/// Reduction operator. kMean is kSum followed by a division by the world size (for integer types a
/// truncating integer division, as in C++). Follows tf.distribute.ReduceOp and ncclRedOp_t.
enum class ReduceOp : std::uint8_t {
  kSum = 0,
  kMean = 1,
  kMin = 2,
  kMax = 3,
  kProd = 4,
};

/// Size of one element of `dtype`, in bytes. Never throws.
MWMS_API std::size_t dtype_size(DataType dtype) noexcept;

/// Lower-case name of `dtype` as the bench tools print it ("float32", "bfloat16", ...).
MWMS_API std::string_view to_string(DataType dtype) noexcept;

/// Lower-case name of `op` ("sum", "mean", "min", "max", "prod").
MWMS_API std::string_view to_string(ReduceOp op) noexcept;

/// Parses a dtype name: "float32"/"float"/"f32", "float64"/"double"/"f64", "float16"/"half"/"f16",
/// "bfloat16"/"bf16", "int32"/"int", "int64". @throws mwms::InvalidArgument on any other name.
MWMS_API DataType parse_dtype(std::string_view name);

/// Parses "sum", "mean"/"avg", "min", "max", "prod". @throws mwms::InvalidArgument otherwise.
MWMS_API ReduceOp parse_reduce_op(std::string_view name);

}  // namespace mwms
