// The NCCL backend's view of NCCL and of the few CUDA runtime calls it needs: a table of plain
// function pointers with no NCCL or CUDA type in it. nccl_api.cc fills it from the real libraries
// (builds with NCCL only); tests fill it with a fake (tests/unit/collective/fake_nccl.h), which
// drives the in-progress -> timeout -> abort path and the error mapping on machines without a
// GPU. The NCCL replica group (nccl_group.h) and NcclBackend use nothing else, so they compile in
// every build.
//
// Status codes are NCCL's ncclResult_t values (for the NCCL entries) and cudaError_t values (for
// the CUDA entries), as ints. Pointers to device memory and streams (cudaStream_t cast to void*)
// are opaque here.
#pragma once

#include <array>
#include <cstddef>

#include "collective/backend/cuda_api.h"  // CudaStatus: the CUDA entries' codes
#include "mwms/types.h"

namespace mwms::collective {

/// ncclResult_t values the backend tells apart (nccl.h).
enum NcclStatus : int {
  kNcclSuccess = 0,
  kNcclUnhandledCudaError = 1,
  kNcclSystemError = 2,
  kNcclInternalError = 3,
  kNcclInvalidArgument = 4,
  kNcclInvalidUsage = 5,
  kNcclRemoteError = 6,
  kNcclInProgress = 7,
};

/// NCCL's unique id (ncclUniqueId: NCCL_UNIQUE_ID_BYTES = 128 opaque bytes), made by rank 0 and
/// sent to every rank through our bootstrap (Note [nccl unique id] in nccl_unique_id.cc).
struct NcclUniqueId {
  std::array<unsigned char, 128> bytes{};
};

using NcclComm = void*;   // ncclComm_t
using NcclEvent = void*;  // cudaEvent_t

/// The calls the NCCL backend makes. Every entry is required. Thread safety: as the library's.
struct NcclApi {
  const char* name = "nccl";  ///< "nccl", or the fake's name
  // ---- NCCL (ncclResult_t) ----
  int (*get_unique_id)(NcclUniqueId* id) = nullptr;
  /// ncclCommInitRankConfig with config.blocking = 0: may return kNcclInProgress, then
  /// comm_get_async_error reports kNcclInProgress until the communicator is ready.
  int (*comm_init_rank)(NcclComm* comm, int world_size, const NcclUniqueId* id, int rank) = nullptr;
  int (*comm_get_async_error)(NcclComm comm, int* async_error) = nullptr;
  int (*comm_abort)(NcclComm comm) = nullptr;
  /// ncclCommFinalize: non-blocking, completion through comm_get_async_error.
  int (*comm_finalize)(NcclComm comm) = nullptr;
  int (*comm_destroy)(NcclComm comm) = nullptr;  ///< ncclCommDestroy (after a completed finalize)
  int (*group_start)() = nullptr;
  int (*group_end)() = nullptr;
  int (*all_reduce)(const void* send, void* recv, std::size_t count, DataType dtype, ReduceOp op,
                    NcclComm comm, void* stream) = nullptr;
  int (*reduce_scatter)(const void* send, void* recv, std::size_t recv_count, DataType dtype,
                        ReduceOp op, NcclComm comm, void* stream) = nullptr;
  int (*all_gather)(const void* send, void* recv, std::size_t send_count, DataType dtype,
                    NcclComm comm, void* stream) = nullptr;
  int (*broadcast)(const void* send, void* recv, std::size_t count, DataType dtype, int root,
                   NcclComm comm, void* stream) = nullptr;
  const char* (*error_string)(int result) = nullptr;       ///< ncclGetErrorString
  const char* (*last_error)(NcclComm comm) = nullptr;      ///< ncclGetLastError
  // ---- CUDA runtime (cudaError_t) ----
  /// cudaSetDevice(local_rank % device count); *device = the device chosen.
  int (*set_device)(int local_rank, int* device) = nullptr;
  int (*event_create)(NcclEvent* event) = nullptr;          ///< cudaEventDisableTiming
  int (*event_record)(NcclEvent event, void* stream) = nullptr;
  int (*event_query)(NcclEvent event) = nullptr;            ///< 0 done, kCudaErrorNotReady pending
  int (*event_destroy)(NcclEvent event) = nullptr;
  /// cudaMalloc(ptr, bytes) on the current device (the barrier's one-element scratch buffer).
  int (*malloc_device)(void** ptr, std::size_t bytes) = nullptr;
  int (*free_device)(void* ptr) = nullptr;                  ///< cudaFree
  /// The mean's division on the device (kernels/cuda: the CPU path's bits), enqueued on stream.
  int (*scale_divide)(void* buffer, std::size_t count, DataType dtype, int divisor,
                      void* stream) = nullptr;
  const char* (*cuda_error_string)(int code) = nullptr;     ///< cudaGetErrorString: the text
};

/// The table over the real NCCL and CUDA runtime, or nullptr in a build without NCCL
/// (nccl_api.cc / nccl_api_none.cc). Never throws.
const NcclApi* real_nccl_api() noexcept;

}  // namespace mwms::collective
