// The host-staged backend's view of the CUDA runtime (Note [host-staged path] in
// staged_backend.h): a table of plain function pointers with no CUDA type in it, as nccl_api.h is
// for NCCL. cuda_api.cc fills it from libcudart (CUDA builds only); tests fill it with a fake
// (tests/support/fake_cuda.h) whose "device memory" is host memory it hands out and remembers, so
// the staged path runs end to end across real processes on machines without a GPU. The staged
// backend uses nothing else, so it compiles in every build.
//
// Status codes are cudaError_t values as ints; streams (cudaStream_t) and events (cudaEvent_t)
// are opaque void*.
#pragma once

#include <cstddef>
#include <exception>
#include <string>

#include "mwms/errors.h"

namespace mwms::collective {

/// Direction of a copy (cudaMemcpyKind values).
enum class CudaCopy : int { kHostToDevice = 1, kDeviceToHost = 2 };

using CudaEvent = void*;  // cudaEvent_t

/// The CUDA runtime calls of the staged backend. Every entry is required. Thread safety: as the
/// CUDA runtime's (the current device is per thread).
struct CudaApi {
  const char* name = "cuda";  ///< "cuda", or the fake's name
  int (*get_device_count)(int* count) = nullptr;           ///< cudaGetDeviceCount
  int (*set_device)(int device) = nullptr;                 ///< cudaSetDevice
  int (*malloc_host)(void** ptr, std::size_t bytes) = nullptr;  ///< cudaMallocHost (pinned)
  int (*free_host)(void* ptr) = nullptr;                   ///< cudaFreeHost
  /// cudaMemcpyAsync(dst, src, bytes, kind, stream): enqueued on `stream`, returns at once.
  int (*memcpy_async)(void* dst, const void* src, std::size_t bytes, CudaCopy kind,
                      void* stream) = nullptr;
  int (*stream_synchronize)(void* stream) = nullptr;       ///< cudaStreamSynchronize
  int (*event_create)(CudaEvent* event) = nullptr;         ///< cudaEventDisableTiming
  int (*event_record)(CudaEvent event, void* stream) = nullptr;
  int (*event_query)(CudaEvent event) = nullptr;           ///< 0 done, 600 (not ready) pending
  int (*event_destroy)(CudaEvent event) = nullptr;
  /// cudaPointerGetAttributes: *is_device = 1 for device or managed memory, 0 for host memory
  /// (pageable or pinned). A pointer CUDA has never seen is host memory (0, success).
  int (*pointer_is_device)(const void* ptr, int* is_device) = nullptr;
  const char* (*error_string)(int code) = nullptr;         ///< cudaGetErrorString: the text
};

/// cudaError_t values the device backends tell apart (driver_types.h), for the CUDA entries of
/// CudaApi and of NcclApi (nccl_api.h).
enum CudaStatus : int {
  kCudaSuccess = 0,
  kCudaErrorInsufficientDriver = 35,  ///< no NVIDIA driver (or one too old for the runtime)
  kCudaErrorNoDevice = 100,           ///< no CUDA-capable device
  kCudaErrorNotReady = 600,           ///< an event or stream still has work pending
};

/// cudaErrorNotReady: the staged backend's name for it.
inline constexpr int kCudaNotReady = kCudaErrorNotReady;

/// The table over the real CUDA runtime, or nullptr in a build without CUDA (cuda_api.cc /
/// cuda_api_none.cc). Never throws.
const CudaApi* real_cuda_api() noexcept;

/// The one conversion of a failed cudaError_t into an mwms error (STYLE item 18), shared by the
/// NCCL and the staged backend: a BackendError whose native_code() is `code` and whose message
/// is "<call> failed: CUDA error <code> (<text>)". Never throws (returns the error to throw).
std::exception_ptr cuda_error(int code, const char* text, const std::string& call,
                              ErrorContext ctx) noexcept;

}  // namespace mwms::collective
