// The --backend nccl sweep and bucket_perf's device path, written against a small table of device
// calls (Runtime) instead of the CUDA runtime and NCCL themselves, so that it compiles in every
// build and its logic (buffer layout, check copied back, timing per Note [device timing], the
// reductions over ranks, the raw NCCL columns) is tested on machines without a GPU, over host
// memory and a fake DeviceCommunicator (tests/unit/bench/device_sweep_test.cc). device_bench.cc
// supplies the real table (CUDA runtime, raw NCCL) in a build with NCCL.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "common/collective.h"
#include "common/options.h"
#include "common/output.h"
#include "mwms/device_communicator.h"

namespace mwms::bench::device {

/// The device calls the sweep makes. Every entry is required. Pointers are device memory
/// (opaque here); streams are cudaStream_t as void*. Errors are thrown as mwms::Error subclasses
/// (BackendError with the native code for CUDA/NCCL failures, TimeoutError for raw NCCL's
/// deadline).
struct Runtime {
  void* (*alloc)(std::size_t bytes) = nullptr;  ///< zeroed device memory (bytes > 0)
  void (*release)(void* p) noexcept = nullptr;
  void* (*stream_create)() = nullptr;  ///< a stream of the current device
  void (*stream_destroy)(void* stream) noexcept = nullptr;
  /// Copies, complete when they return (ordered on `stream`).
  void (*to_device)(void* dst, const void* src, std::size_t bytes, void* stream) = nullptr;
  void (*to_host)(void* dst, const void* src, std::size_t bytes, void* stream) = nullptr;
  /// Raw NCCL (--compare nccl): a communicator of its own beside `ours`, on the same device,
  /// created collectively by every rank (its unique id sent through `ours`).
  void* (*raw_create)(DeviceCommunicator& ours, void* stream) = nullptr;
  void (*raw_destroy)(void* raw) noexcept = nullptr;
  /// Enqueues the raw collective `kind` in place on `buffer`, the layout of the host path
  /// (reduce-scatter's result and all-gather's input at block s.rank).
  void (*raw_enqueue)(void* raw, DeviceCollective kind, void* buffer, const CallShape& s,
                      DataType dtype, void* stream) = nullptr;
  /// Waits until everything enqueued on `stream` completed, under raw NCCL's deadline.
  void (*raw_wait)(void* raw, void* stream) = nullptr;
  std::string (*library)() = nullptr;  ///< "NCCL 2.28.9", for the banner and the JSON
};

/// The --backend nccl sweep of `collective` on `comm` (rank 0 prints the table, footer and
/// JSON); see run_sweep() in device_bench.h. Returns the exit status (1 when any element was
/// wrong). @throws InvalidArgument (--root not a rank), and whatever `comm` and `rt` throw.
int sweep(const CollectiveDescriptor& collective, const BenchOptions& options,
          DeviceCommunicator& comm, const Runtime& rt);

/// bucket_perf's device path on `comm`; see run_buckets() in device_bench.h. Fills `*info`.
/// @throws whatever `comm` and `rt` throw.
BucketRow buckets(const std::vector<std::size_t>& counts, const BucketOptions& options,
                  DeviceCommunicator& comm, const Runtime& rt, BucketRunInfo* info);

}  // namespace mwms::bench::device
