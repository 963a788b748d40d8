// The NCCL backend (DESIGN "The transport seam": a backend, not a transport): collectives on
// device buffers handed whole to NCCL, on the caller's stream, with our deadlines around NCCL's
// non-blocking communicator. Everything goes through an NcclApi table (nccl_api.h), so this file
// compiles in every build and the timeout/abort path and the error mapping are tested with a fake.
//
// Note [nccl deadlines]: NCCL itself never times out: a collective whose peer died spins in its
// kernel forever, and a blocking ncclCommInitRank waits forever for a peer that never comes. So
// the communicator is created with config.blocking = 0, every NCCL call that returns
// ncclInProgress is followed by polling ncclCommGetAsyncError, and a collective's completion is a
// CUDA event recorded after it on the stream. Whoever waits (Work::wait, Work::test, the
// destructor) polls the event and ncclCommGetAsyncError against the collective's deadline
// (started + timeout_seconds). An asynchronous error (ncclRemoteError, ncclSystemError: a peer
// or its connection failed) becomes a PeerError; the deadline passing becomes a TimeoutError;
// either way this rank calls ncclCommAbort, which stops its kernels and frees the stream, and the
// communicator is poisoned (later calls throw InvalidUsage carrying the cause). Every rank does
// the same under its own deadline, so a dead peer ends in an error on every survivor, never in a
// kernel that spins. The deadline is checked only while someone waits or tests: a collective
// nobody waits for is aborted by the next wait or by the destructor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>

#include "collective/backend/device_backend.h"
#include "collective/backend/nccl_api.h"
#include "common/socket.h"
#include "mwms/communicator.h"
#include "mwms/errors.h"

namespace mwms::collective {

struct NcclBackendOptions {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;                 ///< picks the device: local_rank % device count
  double timeout_seconds = 300;       ///< per collective (Note [nccl deadlines])
  double init_timeout_seconds = 300;  ///< communicator creation
  ErrorContext context;               ///< rank, world size, task: copied into every error
};

/// Where a foreign status came from, for to_error().
enum class NativeSource { kNccl, kCuda };

/// The one conversion of an NCCL or CUDA status into an mwms error (STYLE item 18): a
/// BackendError whose native_code() is `code` and whose message names `call`, the code and its
/// text (plus NCCL's last error for the communicator, when there is one); ncclRemoteError and
/// ncclSystemError, which NCCL reports when a peer or its connection failed, become PeerError.
/// Never throws (returns the error to throw).
std::exception_ptr to_error(const NcclApi& api, NativeSource source, int code,
                            const std::string& call, NcclComm comm, ErrorContext ctx) noexcept;

/// State shared between the backend and its Work handles (which may outlive calls but not the
/// communicator's use): the communicator, the poison and the abort. Thread-safe.
struct NcclShared {
  const NcclApi* api = nullptr;
  NcclComm comm = nullptr;
  NcclBackendOptions options;
  std::mutex mutex;
  std::exception_ptr poison;  // set once: the first failure
  bool aborted = false;
  bool destroyed = false;
  bool finalized = false;  // destroyed by NcclBackend::finalize (not by a failure)

  /// Records `cause` as the poison (first one wins) and calls comm_abort once. Never throws.
  void fail(std::exception_ptr cause) noexcept;
  /// The poison, or nullptr.
  std::exception_ptr failure();
  /// Asks NCCL for the communicator's asynchronous state under the mutex, so that no other
  /// thread's fail() (ncclCommAbort) or the destructor frees the communicator during the calls.
  /// Returns the poison once failed, aborted or destroyed; the error of a failed
  /// ncclCommGetAsyncError or of an asynchronous error (`what` names the operation); nullptr
  /// while NCCL reports success or in progress (*in_progress says which). Does not poison: the
  /// caller passes an error to fail(). Never throws.
  std::exception_ptr async_failure(const std::string& what, const ErrorContext& ctx,
                                   bool* in_progress) noexcept;
};

class NcclBackend final : public DeviceBackend {
 public:
  /// Selects the device, creates the NCCL communicator for `options.rank` of
  /// `options.world_size` from `id` (non-blocking) and waits until it is ready or
  /// init_timeout_seconds passed. Blocking. @throws TimeoutError (a rank never joined; the
  /// communicator was aborted), PeerError, BackendError (NCCL/CUDA failures with their codes).
  NcclBackend(const NcclApi& api, const NcclUniqueId& id, NcclBackendOptions options);
  /// Waits (bounded by each one's deadline) for the collectives still running, then finalizes and
  /// destroys the communicator (bounded by timeout_seconds; aborted past it), unless finalize()
  /// did already. Frees the barrier's scratch buffer. Never throws.
  ~NcclBackend() override;
  NcclBackend(const NcclBackend&) = delete;
  NcclBackend& operator=(const NcclBackend&) = delete;

  /// Enqueues `calls` (one NCCL group when more than one: a bucket) on `stream` (cudaStream_t as
  /// void*) and returns at once with a Work that completes when all of them have completed on the
  /// device (a CUDA event). kMean is summed, then divided on the device as the CPU path divides.
  /// One thread at a time (any thread: it makes device() current for the calling thread).
  /// @throws InvalidUsage (poisoned: carries the cause), InvalidArgument
  /// (root out of range, null buffer with count > 0), BackendError/PeerError from NCCL or CUDA,
  /// TimeoutError (NCCL still enqueueing at the deadline).
  std::shared_ptr<Work> launch(const DeviceCall* calls, std::size_t num_calls,
                               void* stream) override;

  /// Note [nccl barrier]: NCCL has no barrier; as torch.distributed's barrier on NCCL does, this
  /// all-reduces one element (int32 max: no overflow whatever the scratch holds) of a device
  /// scratch buffer (cudaMalloc'd on first use, 4 bytes, freed by the destructor) on `stream`
  /// and waits for it under the collective's deadline. Its completion means every rank enqueued
  /// it and everything before it on `stream` ran. A rank that never arrives: TimeoutError and
  /// abort, as any collective. @throws as launch(), and BackendError (cudaMalloc failed: not
  /// poisoned).
  void barrier(void* stream) override;
  /// Waits for the latest launch's Work (its errors are thrown, the backend poisoned), then
  /// ncclCommFinalize (non-blocking: polled until NCCL reports the communicator globally
  /// quiescent, i.e. every rank finalized, for at most timeout_seconds) and ncclCommDestroy.
  /// Later launches throw InvalidUsage ("finalized"); a second call does nothing.
  /// @throws InvalidUsage (poisoned before), the last collective's error, TimeoutError (a rank
  ///   never finalized in time: the communicator was aborted), PeerError/BackendError (NCCL's).
  void finalize() override;
  /// Aborts the NCCL communicator and poisons the backend with `reason`. Never throws.
  void abort(const std::string& reason) noexcept override;

  /// The CUDA device this rank uses.
  int device() const noexcept override { return device_; }
  /// Number of launches so far (each a group of calls).
  std::uint64_t seq() const noexcept { return seq_; }
  /// "nccl (device D, world size N)".
  std::string describe() const override;

 private:
  ErrorContext context(const char* op, std::int64_t seq) const;
  /// Throws InvalidUsage when the backend is poisoned or finalized.
  void throw_if_unusable(const ErrorContext& ctx) const;
  /// launch() with `op` naming the collective in its errors.
  std::shared_ptr<Work> launch_as(const char* op, const DeviceCall* calls, std::size_t num_calls,
                                  void* stream);
  /// Frees the barrier's scratch buffer, if any. Never throws.
  void free_scratch() noexcept;
  void check(NativeSource source, int code, const char* call, const ErrorContext& ctx);
  /// Polls comm_get_async_error until it is not kNcclInProgress, before `deadline`.
  void wait_not_in_progress(const char* what, common::Deadline deadline, const ErrorContext& ctx);

  std::shared_ptr<NcclShared> shared_;
  int device_ = -1;
  std::uint64_t seq_ = 0;
  // The latest launch's Work, held even when the caller dropped it: finalize() and the
  // destructor wait for it (bounded by its deadline) before the communicator goes.
  std::shared_ptr<Work> last_;
  void* scratch_ = nullptr;   // device memory: the barrier's element (Note [nccl barrier])
};

}  // namespace mwms::collective
