#include "kernels/reducer.h"

#include <string>

#include "kernels/reduce.h"
#include "mwms/errors.h"

namespace mwms::kernels {

BufferLocation Reducer::locate(const void* buffer) noexcept {
  // nullptr (an empty buffer) cannot be device memory: answered here without a CUDA runtime call.
  return buffer == nullptr ? BufferLocation::kHost : detail::device_locate(buffer);
}

void Reducer::reduce(void* dst, const void* src, std::size_t count, DataType dtype,
                     ReduceOp op) const {
  if (count == 0) return;  // before locate(): nothing to reduce needs no driver query
  const BufferLocation d = locate(dst);
  const BufferLocation s = locate(src);
  // One kernel must read both operands: the CPU loops cannot dereference a device pointer and
  // the CUDA kernels are written for device memory. A caller bug, reported before a byte moves.
  if (d != s) {
    throw InvalidArgument(std::string("Reducer::reduce: dst is ") +
                          (d == BufferLocation::kDevice ? "device" : "host") + " memory but src is " +
                          (s == BufferLocation::kDevice ? "device" : "host") +
                          " memory; stage both in one place first");
  }
  if (d == BufferLocation::kHost) {
    kernels::reduce(dst, src, count, dtype, op);
  } else {
    // Blocks until the stream drained (reducer.h): callers read dst right after this returns.
    detail::device_reduce(dst, src, count, dtype, op, stream_);
  }
}

void Reducer::scale_divide(void* buffer, std::size_t count, DataType dtype, int divisor) const {
  if (count == 0) return;  // as in reduce(): never ask the driver about an empty span's pointer
  if (locate(buffer) == BufferLocation::kHost) {
    kernels::scale_divide(buffer, count, dtype, divisor);
  } else {
    detail::device_scale_divide(buffer, count, dtype, divisor, stream_);
  }
}

}  // namespace mwms::kernels
