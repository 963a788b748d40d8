// The host-staged backend: collectives on device buffers through the engine (our algorithms over
// shm/TCP/MPI), for when NCCL cannot be used: Implementation::kRing on a DeviceCommunicator,
// more ranks on a host than it has GPUs (NCCL refuses two ranks on one device), or a build
// without NCCL. Everything CUDA goes through a CudaApi table (cuda_api.h), so this file compiles
// in every build and runs end to end over a fake CUDA runtime in CI.
//
// Note [host-staged path]: each collective is
//   1. device -> pinned host: cudaMemcpyAsync on the caller's stream into a page-locked staging
//      buffer (cudaMallocHost: allocated once, grown to the largest message, never per call),
//      stream-ordered after whatever produced the data; an event after the copy;
//   2. the host waits for that event (polled against the collective's deadline), then runs the
//      engine's collective on the staging buffer (blocking, under the engine's own deadline; a
//      dead peer is the engine's PeerError, a stall its TimeoutError);
//   3. pinned host -> device: cudaMemcpyAsync on the caller's stream; the Work is an event
//      recorded after it, so it completes once the result is in device memory, and later work on
//      the stream is ordered after it.
// The call therefore blocks through step 2 (unlike NCCL's, which only enqueues) and returns a
// Work for step 3. An all-reduce (a bucket: its tensors packed one after the other into the
// staging buffer, one engine all-reduce for all of them, since they share dtype and op) or a
// broadcast larger than `pipeline_bytes` is cut into pieces: every piece's device->host copy is
// enqueued at once, each followed by its own event, and the engine reduces piece k while the copy
// engine still moves pieces k+1..; piece k's host->device copy is enqueued as soon as the engine
// finished it. All ranks cut alike (the same constant, the same count). An element's bits depend
// only on which engine call reduced it: results equal the engine's on host buffers cut the same
// way (with pipeline_bytes 0, the engine's on the whole buffer). The staging buffer is reused by
// the next call only after the previous call's host->device copies completed (its Work), since
// the caller may use another stream. Cost: two PCIe copies (about 2 x bytes / 25 GB/s on PCIe 4
// x16) plus the engine's time for the same bytes in host memory; the pieces hide most of the
// copies behind the engine for large messages.
#pragma once

#include <cstddef>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "collective/backend/cuda_api.h"
#include "collective/backend/device_backend.h"
#include "common/socket.h"
#include "mwms/communicator.h"
#include "mwms/errors.h"

namespace mwms::collective {

/// Default piece of the staged pipeline (Note [host-staged path]): large enough that an engine
/// call runs at full bandwidth, small enough that the first piece's copy is short.
inline constexpr std::size_t kStagedPipelineBytes = std::size_t{4} << 20;

struct StagedBackendOptions {
  int local_rank = 0;               ///< picks the device: local_rank % device count
  double timeout_seconds = 300;     ///< per collective: the copies' waits (the engine has its own)
  std::size_t pipeline_bytes = kStagedPipelineBytes;  ///< 0: one engine call per collective
  ErrorContext context;             ///< task: copied into every error
};

/// State shared by the backend and its Work handles: the table and the poison. Thread-safe.
struct StagedShared {
  const CudaApi* api = nullptr;
  std::mutex mutex;
  std::exception_ptr poison;  // the first failure
  /// Records `cause` as the poison (first one wins). Never throws.
  void fail(std::exception_ptr cause) noexcept;
  /// The poison, or nullptr.
  std::exception_ptr failure();
};

class StagedWork;

/// DeviceBackend over the engine `engine` (a Communicator on host memory, any transport) with
/// pinned staging buffers; see Note [host-staged path]. One thread at a time calls launch().
class StagedBackend final : public DeviceBackend {
 public:
  /// Selects device local_rank % device count. Blocking only in CUDA's first call.
  /// @throws BackendError (no usable device: no driver or no GPU; a CUDA call failed: the call,
  ///   the code and its text).
  StagedBackend(const CudaApi& api, std::unique_ptr<Communicator> engine,
                StagedBackendOptions options);
  /// Waits for the last collective's copies (bounded by its deadline; after a failed one, for the
  /// copies it left in flight, bounded alike: the buffer is leaked if they never finish), frees
  /// the staging buffer and the events, then destroys the engine (closing its links). Never
  /// throws.
  ~StagedBackend() override;
  StagedBackend(const StagedBackend&) = delete;
  StagedBackend& operator=(const StagedBackend&) = delete;

  /// Runs `calls` as Note [host-staged path] says; several calls are a bucket (all-reduces of one
  /// dtype and op, one engine all-reduce). Blocks until the engine finished; the Work completes
  /// when the results are in device memory. Any thread, one at a time (sets the device for it).
  /// @throws InvalidUsage (poisoned, carrying the cause), InvalidArgument (a null or host buffer
  ///   with count > 0, root out of range, a bucket mixing dtypes or ops), BackendError (a CUDA
  ///   call failed), TimeoutError (a copy not done by the deadline), and the engine's errors
  ///   (PeerError, TimeoutError, CollectiveMismatchError).
  std::shared_ptr<Work> launch(const DeviceCall* calls, std::size_t num_calls,
                               void* stream) override;

  /// Waits (under the collective timeout) for an event recorded on `stream` now, i.e. for the
  /// work enqueued before, then runs the engine's barrier. @throws as launch().
  void barrier(void* stream) override;
  /// Waits for the last collective's copies back, then finalizes the engine (Communicator::
  /// finalize: a barrier, "finalized" to every peer, links closed). Later launches throw
  /// InvalidUsage ("finalized"); a second call does nothing. @throws InvalidUsage (poisoned),
  ///   the last collective's error, the engine's finalize errors (the backend is then poisoned).
  void finalize() override;
  /// Aborts the engine (peers fail with PeerError naming this rank) and poisons. Never throws.
  void abort(const std::string& reason) noexcept override;
  int device() const noexcept override { return device_; }
  /// "host-staged (device D, world size N): <the engine's describe()>".
  std::string describe() const override;
  /// Bytes of pinned staging memory held now.
  std::size_t staging_bytes() const noexcept { return stage_bytes_; }

 private:
  // A span of device memory and where it sits in the staging buffer.
  struct Segment {
    void* device;
    std::size_t offset;
    std::size_t bytes;
  };

  ErrorContext context(const char* op) const;
  void check(int code, const char* call, const ErrorContext& ctx);
  /// Throws InvalidUsage when the backend is poisoned or finalized.
  void throw_if_unusable(const ErrorContext& ctx);
  void validate(const DeviceCall* calls, std::size_t num_calls, const ErrorContext& ctx);
  unsigned char* stage(std::size_t bytes, const ErrorContext& ctx);
  void copy(void* dst, const void* src, std::size_t bytes, CudaCopy kind, void* stream,
            const ErrorContext& ctx);
  void wait_event(CudaEvent event, const char* what, common::Deadline deadline,
                  const ErrorContext& ctx);
  CudaEvent piece_event(std::size_t i, const ErrorContext& ctx);
  // All-reduce or broadcast over `segments`, cut into pieces (Note [host-staged path]).
  void pipelined(const DeviceCall& call, const std::vector<Segment>& segments,
                 std::size_t total_bytes, void* stream, common::Deadline deadline,
                 const ErrorContext& ctx);
  void run(const DeviceCall* calls, std::size_t num_calls, void* stream,
           common::Deadline deadline, const ErrorContext& ctx);

  std::shared_ptr<StagedShared> shared_;
  std::unique_ptr<Communicator> engine_;
  StagedBackendOptions options_;
  int device_ = -1;
  unsigned char* stage_ = nullptr;  // pinned
  std::size_t stage_bytes_ = 0;
  std::vector<CudaEvent> piece_events_;  // reused by every call
  std::vector<Segment> segments_;        // reused by every call
  std::shared_ptr<StagedWork> last_;     // the previous call's copies back (stage reuse waits)
  CudaEvent drain_ = nullptr;            // recorded after a failed call's copies
  bool finalized_ = false;
};

}  // namespace mwms::collective
