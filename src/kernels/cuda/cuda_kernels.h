// CUDA kernels for device buffers (DESIGN "src/kernels"): reduce, the mean's division, pack and
// unpack of many tensors into one bucket, float32 <-> float16/bfloat16 casts. A type-erased
// boundary (pointers, count, dtype, op, stream) with templates inside, as the CPU kernels; the
// element operations are those of kernels/element_ops.h, so the results are the CPU path's bits
// (Note [gpu bit identity]).
//
// No CUDA type appears here, so g++-compiled code can call the kernels: `stream` is a
// cudaStream_t cast to void* (nullptr: the legacy default stream), and each launcher returns the
// cudaError_t of the launch as an int (0 = cudaSuccess). Every launcher is asynchronous with
// respect to the host (it only enqueues work on `stream`), never throws, never allocates, and
// needs every pointer to be device memory (or managed memory) of the current device. Built only
// with MWMS_WITH_CUDA (kernels/cuda/cuda_kernels.cu).
#pragma once

#include <cstddef>
#include <cstdint>

#include "mwms/errors.h"
#include "mwms/types.h"

namespace mwms::kernels::cuda {

/// dst[i] = op(dst[i], src[i]) for i in [0, count), exactly as kernels::reduce (kMean reduces as
/// kSum). dst == src is allowed; partial overlap is not.
int reduce(void* dst, const void* src, std::size_t count, DataType dtype, ReduceOp op,
           void* stream) noexcept;

/// buffer[i] /= divisor, exactly as kernels::scale_divide. Precondition: divisor != 0.
int scale_divide(void* buffer, std::size_t count, DataType dtype, int divisor,
                 void* stream) noexcept;

/// dst[i] = float32 src[i] rounded to `to` (kFloat16 or kBFloat16), as kernels::float32_to_16.
int float32_to_16(std::uint16_t* dst, const float* src, std::size_t count, DataType to,
                  void* stream) noexcept;
/// dst[i] = the `from` value src[i] widened to float32, as kernels::float16_to_32.
int float16_to_32(float* dst, const std::uint16_t* src, std::size_t count, DataType from,
                  void* stream) noexcept;

/// One tensor of a bucket: `bytes` bytes at `tensor`, stored at byte `offset` of the bucket.
struct PackEntry {
  void* tensor = nullptr;
  std::size_t bytes = 0;
  std::size_t offset = 0;
};

/// bucket[offset, offset + bytes) = tensor for every entry (gradient buckets, DESIGN "Strategy").
/// Entries must not overlap in the bucket; `entries` is host memory, read before the call returns.
int pack(void* bucket, const PackEntry* entries, std::size_t num_entries, void* stream) noexcept;
/// tensor = bucket[offset, offset + bytes) for every entry: the inverse of pack().
int unpack(const void* bucket, const PackEntry* entries, std::size_t num_entries,
           void* stream) noexcept;

/// cudaGetErrorName(code) + ": " + cudaGetErrorString(code), e.g.
/// "cudaErrorInsufficientDriver: CUDA driver version is insufficient for CUDA runtime version".
const char* error_name(int code) noexcept;
const char* error_string(int code) noexcept;

/// The one conversion of a CUDA runtime status into an mwms error (STYLE item 18): does nothing
/// for 0, else throws BackendError whose native_code() is the cudaError_t and whose message names
/// `call`, the code's name and its text. @throws BackendError.
void check(int code, const char* call, const ErrorContext& ctx = {});

}  // namespace mwms::kernels::cuda
