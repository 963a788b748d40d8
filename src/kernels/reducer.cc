#include "kernels/reducer.h"

#include <string>

#include "kernels/reduce.h"
#include "mwms/errors.h"

namespace mwms::kernels {

BufferLocation Reducer::locate(const void* buffer) noexcept {
  return buffer == nullptr ? BufferLocation::kHost : detail::device_locate(buffer);
}

void Reducer::reduce(void* dst, const void* src, std::size_t count, DataType dtype,
                     ReduceOp op) const {
  if (count == 0) return;
  const BufferLocation d = locate(dst);
  const BufferLocation s = locate(src);
  if (d != s) {
    throw InvalidArgument(std::string("Reducer::reduce: dst is ") +
                          (d == BufferLocation::kDevice ? "device" : "host") + " memory but src is " +
                          (s == BufferLocation::kDevice ? "device" : "host") +
                          " memory; stage both in one place first");
  }
  if (d == BufferLocation::kHost) {
    kernels::reduce(dst, src, count, dtype, op);
  } else {
    detail::device_reduce(dst, src, count, dtype, op, stream_);
  }
}

void Reducer::scale_divide(void* buffer, std::size_t count, DataType dtype, int divisor) const {
  if (count == 0) return;
  if (locate(buffer) == BufferLocation::kHost) {
    kernels::scale_divide(buffer, count, dtype, divisor);
  } else {
    detail::device_scale_divide(buffer, count, dtype, divisor, stream_);
  }
}

}  // namespace mwms::kernels
