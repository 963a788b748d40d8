// The NCCL backend (DESIGN "The transport seam": a backend, not a transport): collectives on
// device buffers handed whole to NCCL, on the caller's stream, for DeviceCommunicator (one NCCL
// rank per process). It is the K = 1 case of the NCCL replica group (nccl_group.h, role kRank),
// which owns the communicator, the deadlines (Note [nccl deadlines]), the Work and the failure
// path; this class adds the DeviceBackend face and the barrier.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "collective/backend/device_backend.h"
#include "collective/backend/nccl_api.h"
#include "collective/backend/nccl_group.h"
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
  /// scratch buffer (cudaMalloc'd on first use, 4 bytes, freed once the communicator is gone)
  /// on `stream` and waits for it under the collective's deadline. Its completion means every
  /// rank enqueued it and everything before it on `stream` ran. A rank that never arrives:
  /// TimeoutError and abort, as any collective. @throws as launch(), and BackendError
  /// (cudaMalloc failed: not poisoned).
  void barrier(void* stream) override;
  /// Waits for the latest launch's Work (its errors are thrown, the backend poisoned), then
  /// ncclCommFinalize (non-blocking: polled until NCCL reports the communicator globally
  /// quiescent, i.e. every rank finalized, for at most timeout_seconds) and ncclCommDestroy.
  /// Later launches throw InvalidUsage ("finalized"); a second call does nothing.
  /// @throws InvalidUsage (poisoned before), the last collective's error, TimeoutError (a rank
  ///   never finalized in time: the communicator was aborted), PeerError/BackendError (NCCL's).
  void finalize() override;
  /// Aborts the NCCL communicator and poisons the backend with `reason`. Never throws.
  void abort(const std::string& reason) noexcept override { group_->abort(reason); }

  /// The CUDA device this rank uses.
  int device() const noexcept override { return group_->device(0); }
  /// Number of launches so far (each a group of calls).
  std::uint64_t seq() const noexcept { return group_->seq(); }
  /// "nccl (device D, world size N)".
  std::string describe() const override { return group_->describe(); }

 private:
  /// Frees the barrier's scratch buffer, if any; only once the communicator is gone (cudaFree
  /// synchronizes the device, so it would wait for a kernel of a collective nobody waited for).
  /// Never throws.
  void free_scratch() noexcept;

  const NcclApi& api_;
  const int local_rank_;
  std::unique_ptr<NcclReplicaGroup> group_;  // K = 1, role kRank
  void* scratch_ = nullptr;  // device memory: the barrier's element (Note [nccl barrier])
};

}  // namespace mwms::collective
