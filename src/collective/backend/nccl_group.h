// K NCCL ranks driven by one process (TF's MirroredStrategy model: one process, K local GPUs, one
// NCCL rank per GPU), for the strategy's GPU replicas (Note [gpu replicas] in
// src/strategy/device_replicas.cc). Everything goes through an NcclApi table (nccl_api.h), as
// NcclBackend does, so the grouped init, the grouped collectives and the timeout/abort path are
// tested with the fake NCCL on machines without a GPU.
//
// Note [nccl replica group]: NCCL requires group semantics when one thread manages several
// devices (every NCCL call may block waiting for the other ranks, so a plain loop over the local
// communicators would wait on the first for the ones it has not called yet). So:
//   - init: ncclGroupStart; for each local replica r: cudaSetDevice(device r),
//     ncclCommInitRankConfig(blocking = 0, rank first_rank + r); ncclGroupEnd; then poll every
//     communicator's ncclCommGetAsyncError until none is in progress, before the init deadline;
//   - a collective: ncclGroupStart; every replica's calls on its own communicator and stream;
//     ncclGroupEnd; then, per replica on its device, the mean's division and a CUDA event on its
//     stream. The Work completes when all K events have;
//   - deadlines as Note [nccl deadlines]: whoever waits polls the K events and the K
//     communicators' asynchronous errors against the collective's deadline; a failure or the
//     deadline aborts ALL K communicators (a replica's peer is every rank of the world, and one
//     aborted communicator of a group leaves the others' kernels waiting for it) and poisons the
//     group (later launches throw InvalidUsage carrying the cause).
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "collective/backend/nccl_api.h"
#include "collective/backend/nccl_backend.h"
#include "common/socket.h"
#include "mwms/communicator.h"
#include "mwms/errors.h"

namespace mwms::collective {

struct NcclGroupOptions {
  int first_rank = 0;                 ///< NCCL rank of local replica 0 (worker index x K)
  int world_size = 1;                 ///< NCCL ranks in all (workers x K)
  std::vector<int> devices;           ///< per local replica, the index given to set_device (K)
  double timeout_seconds = 300;       ///< per collective (Note [nccl deadlines])
  double init_timeout_seconds = 300;  ///< creation of the K communicators
  ErrorContext context;               ///< worker rank, world size, task: copied into errors
};

/// The K communicators of a group, their poison and the abort; shared with the Work handles.
/// Thread-safe.
struct NcclGroupShared {
  const NcclApi* api = nullptr;
  std::vector<NcclComm> comms;  // per local replica (null where init never returned one)
  NcclGroupOptions options;
  std::mutex mutex;
  std::exception_ptr poison;  // set once: the first failure
  bool aborted = false;
  bool destroyed = false;
  bool finalized = false;  // destroyed by NcclReplicaGroup::finalize (not by a failure)

  /// Records `cause` as the poison (first one wins) and aborts every communicator once. Never
  /// throws.
  void fail(std::exception_ptr cause) noexcept;
  /// The poison, or nullptr.
  std::exception_ptr failure();
};

/// K NCCL ranks of one process (Note [nccl replica group]). Calls come from one thread at a time
/// (any thread: launch() sets each device current before touching it); Work handles may be
/// tested and waited on from any thread.
class NcclReplicaGroup {
 public:
  /// Creates the K = options.devices.size() communicators (ranks first_rank .. first_rank + K - 1
  /// of world_size, from `id`) in one NCCL group and waits until all are ready or
  /// init_timeout_seconds passed. Blocking. @throws InvalidArgument (no devices, or ranks outside
  /// the world), TimeoutError (a rank never joined; all K aborted), PeerError, BackendError
  /// (NCCL/CUDA failures with their codes, naming the local replica).
  NcclReplicaGroup(const NcclApi& api, const NcclUniqueId& id, NcclGroupOptions options);
  /// Waits (bounded by its deadline) for the last collective, then finalizes and destroys the K
  /// communicators (bounded by timeout_seconds; all aborted past it), unless finalize() did
  /// already. Never throws.
  ~NcclReplicaGroup();

  /// Orderly collective shutdown (every process of the NCCL world calls it after its last
  /// launch): waits for the last launch's Work (its error is thrown), then ncclCommFinalize on
  /// the K communicators, polled until NCCL reports each one globally quiescent (every rank of
  /// the world finalized) for at most timeout_seconds, then ncclCommDestroy. Later launches throw
  /// InvalidUsage ("finalized"); a second call does nothing. Blocking.
  /// @throws InvalidUsage (poisoned), the last collective's error, TimeoutError (a rank never
  ///   finalized: all K aborted), PeerError/BackendError (NCCL's, naming the local replica).
  void finalize();
  NcclReplicaGroup(const NcclReplicaGroup&) = delete;
  NcclReplicaGroup& operator=(const NcclReplicaGroup&) = delete;

  /// K.
  int size() const noexcept { return static_cast<int>(devices_.size()); }
  /// The CUDA device local replica r uses (what set_device chose).
  int device(int r) const noexcept { return devices_[static_cast<std::size_t>(r)]; }

  /// Enqueues, in one NCCL group, calls[r * per_replica + i] (i < per_replica) on local replica
  /// r's communicator and `streams[r]` (cudaStream_t as void*; K entries), and returns at once
  /// with a Work that completes when every replica's calls have completed on its device (K CUDA
  /// events). kMean is summed, then divided by world_size on each device. Broadcast roots are
  /// NCCL ranks. More than 2048 NCCL calls (NCCL's group limit) go in several groups, in order.
  /// Returns with local replica 0's device current on the calling thread (as the constructor).
  /// @throws InvalidUsage (poisoned: carries the cause), InvalidArgument (root out of range,
  ///   null buffer with count > 0), BackendError/PeerError from NCCL or CUDA, TimeoutError (NCCL
  ///   still enqueueing at the deadline).
  std::shared_ptr<Work> launch(const DeviceCall* calls, std::size_t per_replica,
                               void* const* streams);

  /// Aborts the K communicators and poisons the group with `reason`. Never throws.
  void abort(const std::string& reason) noexcept;

  /// Number of launches so far.
  std::uint64_t seq() const noexcept { return seq_; }
  /// "nccl (K local devices 0,1, ranks 2..3 of 4)".
  std::string describe() const;

 private:
  ErrorContext context(const char* op, std::int64_t seq) const;
  /// Finalizes and destroys the K communicators (or aborts them all); caller holds the mutex.
  /// Returns the first failure, or nullptr. Never throws.
  std::exception_ptr finalize_locked() noexcept;
  void check(NativeSource source, int code, const std::string& call, NcclComm comm,
             const ErrorContext& ctx);
  void wait_not_in_progress(const char* what, common::Deadline deadline, const ErrorContext& ctx);
  void set_device(int r, const ErrorContext& ctx);

  std::shared_ptr<NcclGroupShared> shared_;
  std::vector<int> devices_;
  std::uint64_t seq_ = 0;
  std::shared_ptr<Work> last_;  // the latest launch's, even if dropped: finalize/destructor wait
};

}  // namespace mwms::collective
