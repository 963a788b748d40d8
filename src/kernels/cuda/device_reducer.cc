// The Reducer's device half and the CUDA status conversion of a CUDA build (host code, g++ with
// the CUDA runtime's headers; the kernels themselves are in cuda_kernels.cu).
#include <cuda_runtime.h>

#include <string>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/reducer.h"

namespace mwms::kernels {

namespace cuda {

const char* error_name(int code) noexcept {
  return cudaGetErrorName(static_cast<cudaError_t>(code));
}

const char* error_string(int code) noexcept {
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}

void check(int code, const char* call, const ErrorContext& ctx) {
  if (code == cudaSuccess) return;
  throw BackendError(std::string(call) + " failed: " + error_name(code) + " (" +
                         std::to_string(code) + "): " + error_string(code),
                     code, ctx);
}

}  // namespace cuda

namespace detail {

BufferLocation device_locate(const void* buffer) noexcept {
  cudaPointerAttributes attr{};
  // Without a driver or a device the query fails: such a buffer cannot be device memory. The
  // failure is cleared so that it does not surface from a later, unrelated cudaGetLastError.
  if (cudaPointerGetAttributes(&attr, buffer) != cudaSuccess) {
    (void)cudaGetLastError();
    return BufferLocation::kHost;
  }
  return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged
             ? BufferLocation::kDevice
             : BufferLocation::kHost;
}

void device_reduce(void* dst, const void* src, std::size_t count, DataType dtype, ReduceOp op,
                   void* stream) {
  cuda::check(cuda::reduce(dst, src, count, dtype, op, stream), "reduce kernel launch");
  cuda::check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "cudaStreamSynchronize");
}

void device_scale_divide(void* buffer, std::size_t count, DataType dtype, int divisor,
                         void* stream) {
  cuda::check(cuda::scale_divide(buffer, count, dtype, divisor, stream), "scale kernel launch");
  cuda::check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "cudaStreamSynchronize");
}

}  // namespace detail

}  // namespace mwms::kernels
