#include "mwms/types.h"

#include <string>

#include "mwms/errors.h"

namespace mwms {

std::size_t dtype_size(DataType dtype) noexcept {
  switch (dtype) {
    case DataType::kFloat32: return 4;
    case DataType::kFloat64: return 8;
    case DataType::kFloat16: return 2;
    case DataType::kBFloat16: return 2;
    case DataType::kInt32: return 4;
    case DataType::kInt64: return 8;
  }
  return 0;
}

std::string_view to_string(DataType dtype) noexcept {
  switch (dtype) {
    case DataType::kFloat32: return "float32";
    case DataType::kFloat64: return "float64";
    case DataType::kFloat16: return "float16";
    case DataType::kBFloat16: return "bfloat16";
    case DataType::kInt32: return "int32";
    case DataType::kInt64: return "int64";
  }
  return "unknown";
}

std::string_view to_string(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kMean: return "mean";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kProd: return "prod";
  }
  return "unknown";
}

DataType parse_dtype(std::string_view name) {
  if (name == "float32" || name == "float" || name == "f32") return DataType::kFloat32;
  if (name == "float64" || name == "double" || name == "f64") return DataType::kFloat64;
  if (name == "float16" || name == "half" || name == "f16") return DataType::kFloat16;
  if (name == "bfloat16" || name == "bf16") return DataType::kBFloat16;
  if (name == "int32" || name == "int") return DataType::kInt32;
  if (name == "int64") return DataType::kInt64;
  throw InvalidArgument("unknown dtype '" + std::string(name) +
                        "' (expected float32, float64, float16, bfloat16, int32 or int64)");
}

ReduceOp parse_reduce_op(std::string_view name) {
  if (name == "sum") return ReduceOp::kSum;
  if (name == "mean" || name == "avg") return ReduceOp::kMean;
  if (name == "min") return ReduceOp::kMin;
  if (name == "max") return ReduceOp::kMax;
  if (name == "prod") return ReduceOp::kProd;
  throw InvalidArgument("unknown reduce op '" + std::string(name) +
                        "' (expected sum, mean, min, max or prod)");
}

}  // namespace mwms
