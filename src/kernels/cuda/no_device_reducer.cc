// The Reducer's device half in a build without CUDA: every buffer is host memory.
#include "kernels/reducer.h"
#include "mwms/errors.h"

namespace mwms::kernels::detail {

BufferLocation device_locate(const void*) noexcept { return BufferLocation::kHost; }

void device_reduce(void*, const void*, std::size_t, DataType, ReduceOp, void*) {
  throw InternalError("device_reduce called in a build without CUDA");
}

void device_scale_divide(void*, std::size_t, DataType, int, void*) {
  throw InternalError("device_scale_divide called in a build without CUDA");
}

}  // namespace mwms::kernels::detail
