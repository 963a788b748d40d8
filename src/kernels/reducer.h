// kernels::Reducer (STYLE item 33): reduce and the mean's division on a buffer wherever it lives,
// host memory through the CPU kernels (kernels/reduce.h), device memory through the CUDA kernels
// (kernels/cuda/cuda_kernels.h), chosen by the buffer's location. In a build without CUDA every
// buffer is host memory.
#pragma once

#include <cstddef>

#include "mwms/types.h"

namespace mwms::kernels {

/// Where a buffer lives, as the reducer sees it.
enum class BufferLocation { kHost, kDevice };

/// Reduces buffers by location. Cheap to copy; holds only the stream. Thread safety: a const
/// object may be used from several threads (each call is independent).
class Reducer {
 public:
  /// `stream`: the cudaStream_t (cast to void*) device work goes on; nullptr is the legacy
  /// default stream. Ignored for host buffers and in builds without CUDA.
  explicit Reducer(void* stream = nullptr) noexcept : stream_(stream) {}

  /// kDevice for device or managed memory (cudaPointerGetAttributes) in a CUDA build with a
  /// usable device; kHost otherwise: host memory, pinned host memory, a build without CUDA, or a
  /// machine without a driver (the query fails, the buffer cannot be device memory). Never throws.
  static BufferLocation locate(const void* buffer) noexcept;

  /// dst[i] = op(dst[i], src[i]), the bits kernels::reduce gives (Note [gpu bit identity] in
  /// element_ops.h). dst and src must live in the same place (both host or both device). Device
  /// buffers: enqueued on the stream, then the stream is synchronised, so the call blocks until
  /// the result is in dst. @throws InvalidArgument (one host and one device buffer), BackendError
  /// (a CUDA launch or synchronisation failed: native code and text).
  void reduce(void* dst, const void* src, std::size_t count, DataType dtype, ReduceOp op) const;

  /// buffer[i] /= divisor as kernels::scale_divide, wherever buffer lives; blocking like reduce().
  /// @throws BackendError as reduce().
  void scale_divide(void* buffer, std::size_t count, DataType dtype, int divisor) const;

 private:
  void* stream_;
};

namespace detail {
/// The device half of the Reducer: kernels/cuda/device_reducer.cc in a CUDA build,
/// kernels/cuda/no_device_reducer.cc otherwise (the build picks one; no #if here).
BufferLocation device_locate(const void* buffer) noexcept;
void device_reduce(void* dst, const void* src, std::size_t count, DataType dtype, ReduceOp op,
                   void* stream);
void device_scale_divide(void* buffer, std::size_t count, DataType dtype, int divisor,
                         void* stream);
}  // namespace detail

}  // namespace mwms::kernels
