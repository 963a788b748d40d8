// The one owner of NCCL communicators (c10d's WorkNCCL over a vector of devices): K NCCL ranks
// driven by one process, with our deadlines around NCCL's non-blocking communicators. Two users:
//   - the strategy's GPU replicas (TF's MirroredStrategy model: one process, K local GPUs, one
//     NCCL rank per GPU; Note [gpu replicas] in src/strategy/device_replicas.cc), through the
//     collective layer's face (collective/device_group.h): role kReplicas;
//   - DeviceCommunicator's NCCL backend (nccl_backend.h): one NCCL rank per process, the K = 1
//     case, role kRank.
// Everything goes through an NcclApi table (nccl_api.h), so this compiles in every build and the
// grouped init, the grouped collectives and the timeout/abort path are tested with the fake NCCL
// on machines without a GPU.
//
// Note [nccl deadlines]: NCCL itself never times out: a collective whose peer died spins in its
// kernel forever, and a blocking ncclCommInitRank waits forever for a peer that never comes. So
// every communicator is created with config.blocking = 0, every NCCL call that returns
// ncclInProgress is followed by polling ncclCommGetAsyncError, and a collective's completion is a
// CUDA event recorded after it on each replica's stream. Whoever waits (Work::wait, Work::test,
// the destructor) polls the events and the communicators' asynchronous errors against the
// collective's deadline (started + timeout_seconds). An asynchronous error (ncclRemoteError,
// ncclSystemError: a peer or its connection failed) becomes a PeerError; the deadline passing
// becomes a TimeoutError; either way this process calls ncclCommAbort on ALL its communicators
// (a replica's peer is every rank of the world, and one aborted communicator of a group leaves
// the others' kernels waiting for it), which stops their kernels, and the group is poisoned
// (later calls throw InvalidUsage carrying the cause). Every process does the same under its own
// deadline, so a dead peer ends in an error on every survivor, never in a kernel that spins. The
// deadline is checked only while someone waits or tests: a collective nobody waits for is
// aborted by the next wait or by the destructor.
//
// Note [nccl replica group]: NCCL requires group semantics when one thread manages several
// devices (every NCCL call may block waiting for the other ranks, so a plain loop over the local
// communicators would wait on the first for the ones it has not called yet). So, for kReplicas:
//   - init: ncclGroupStart; for each local replica r: cudaSetDevice(device r),
//     ncclCommInitRankConfig(blocking = 0, rank first_rank + r); ncclGroupEnd; then poll every
//     communicator's ncclCommGetAsyncError until none is in progress, before the init deadline;
//   - a collective: ncclGroupStart; every replica's calls on its own communicator and stream;
//     ncclGroupEnd; then, per replica on its device, the mean's division and a CUDA event on its
//     stream. The Work completes when all K events have.
// kRank (one device) needs no group for its init or a single call, only for a bucket of calls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "collective/backend/device_backend.h"
#include "collective/backend/nccl_api.h"
#include "common/socket.h"
#include "mwms/communicator.h"
#include "mwms/errors.h"

namespace mwms::collective {

/// Where a foreign status came from, for to_error().
enum class NativeSource { kNccl, kCuda };

/// The one conversion of an NCCL or CUDA status into an mwms error (STYLE item 18): a
/// BackendError whose native_code() is `code` and whose message names `call`, the code and its
/// text (plus NCCL's last error for the communicator, when there is one); ncclRemoteError and
/// ncclSystemError, which NCCL reports when a peer or its connection failed, become PeerError.
/// Never throws (returns the error to throw).
std::exception_ptr to_error(const NcclApi& api, NativeSource source, int code,
                            const std::string& call, NcclComm comm, ErrorContext ctx) noexcept;

/// Whom a group's communicators serve; it decides which calls are grouped and how errors read.
enum class NcclGroupRole {
  /// K local replicas of one process (Note [nccl replica group]): the init and every launch in
  /// an NCCL group; messages name the local replica ("nccl all_reduce (local replica 1)").
  kReplicas,
  /// One NCCL rank per process (NcclBackend, K = 1): an NCCL group only around a bucket of
  /// calls; messages name "the NCCL communicator".
  kRank,
};

struct NcclGroupOptions {
  int first_rank = 0;                 ///< NCCL rank of local replica 0 (worker index x K)
  int world_size = 1;                 ///< NCCL ranks in all (workers x K)
  std::vector<int> devices;           ///< per local replica, the index given to set_device (K)
  double timeout_seconds = 300;       ///< per collective (Note [nccl deadlines])
  double init_timeout_seconds = 300;  ///< creation of the K communicators
  ErrorContext context;               ///< rank, world size, task: copied into errors
  NcclGroupRole role = NcclGroupRole::kReplicas;
};

/// The K communicators of a group, their poison and the abort; shared with the Work handles
/// (which may outlive calls). Thread-safe.
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
  /// Asks NCCL for communicator r's asynchronous state under the mutex, so that no other
  /// thread's fail() (ncclCommAbort) or the destructor frees it during the call. Returns the
  /// poison once failed, aborted or destroyed; the error of a failed ncclCommGetAsyncError or of
  /// an asynchronous error (`what` names the operation); nullptr while NCCL reports success or in
  /// progress (*in_progress says which). The error names `what` + where(r). Does not poison:
  /// the caller passes an error to fail().
  /// Never throws.
  std::exception_ptr async_failure(std::size_t r, const std::string& what, const ErrorContext& ctx,
                                   bool* in_progress) noexcept;
  /// " (local replica r)" for kReplicas, "" for kRank: appended to the name of a failed call.
  std::string where(std::size_t r) const;
};

/// K NCCL ranks of one process (Note [nccl replica group]; K = 1 for NcclBackend). Calls come
/// from one thread at a time (any thread: launch() sets each device current before touching
/// it); Work handles may be tested and waited on from any thread.
class NcclReplicaGroup {
 public:
  /// Creates the K = options.devices.size() communicators (ranks first_rank .. first_rank + K - 1
  /// of world_size, from `id`; kReplicas: in one NCCL group) and waits until all are ready or
  /// init_timeout_seconds passed. Blocking. @throws InvalidArgument (no devices, or ranks outside
  /// the world), InvalidUsage (two replicas on one device), TimeoutError (a rank never joined;
  /// all K aborted), PeerError, BackendError (NCCL/CUDA failures with their codes, naming the
  /// local replica).
  NcclReplicaGroup(const NcclApi& api, const NcclUniqueId& id, NcclGroupOptions options);
  /// Waits (bounded by its deadline) for the last collective, then finalizes and destroys the K
  /// communicators (bounded by timeout_seconds; all aborted past it), unless finalize() did
  /// already. Never throws.
  ~NcclReplicaGroup();
  NcclReplicaGroup(const NcclReplicaGroup&) = delete;
  NcclReplicaGroup& operator=(const NcclReplicaGroup&) = delete;

  /// Orderly collective shutdown (every process of the NCCL world calls it after its last
  /// launch): waits for the last launch's Work (its error is thrown), then ncclCommFinalize on
  /// the K communicators, polled until NCCL reports each one globally quiescent (every rank of
  /// the world finalized) for at most timeout_seconds, then ncclCommDestroy. Later launches throw
  /// InvalidUsage ("finalized"); a second call does nothing. Blocking.
  /// @throws InvalidUsage (poisoned), the last collective's error, TimeoutError (a rank never
  ///   finalized: all K aborted), PeerError/BackendError (NCCL's, naming the local replica).
  void finalize();

  /// K.
  int size() const noexcept { return static_cast<int>(devices_.size()); }
  /// The CUDA device local replica r uses (what set_device chose).
  int device(int r) const noexcept { return devices_[static_cast<std::size_t>(r)]; }

  /// Enqueues calls[r * per_replica + i] (i < per_replica) on local replica r's communicator and
  /// `streams[r]` (cudaStream_t as void*; K entries), and returns at once with a Work that
  /// completes when every replica's calls have completed on its device (K CUDA events). kMean is
  /// summed, then divided by world_size on each device. Broadcast roots are NCCL ranks. More
  /// than 2048 NCCL calls (NCCL's group limit) go in several groups, in order. `op` names the
  /// collective in errors (nullptr: the call's kind, or "group" for several). Returns with local
  /// replica 0's device current on the calling thread (as the constructor).
  /// @throws InvalidUsage (poisoned: carries the cause; finalized), InvalidArgument (root out of
  ///   range, null buffer with count > 0), BackendError/PeerError from NCCL or CUDA, TimeoutError
  ///   (NCCL still enqueueing at the deadline).
  std::shared_ptr<Work> launch(const DeviceCall* calls, std::size_t per_replica,
                               void* const* streams, const char* op = nullptr);

  /// Throws InvalidUsage when the group is poisoned (carrying the cause) or finalized.
  void throw_if_unusable(const ErrorContext& ctx) const;
  /// Makes local replica r's device current on the calling thread. @throws BackendError (and
  ///   poisons the group).
  void set_device(int r, const ErrorContext& ctx);
  /// The group's ErrorContext for `op` at `seq` (transport "nccl").
  ErrorContext context(const char* op, std::int64_t seq) const;
  /// True once the communicators are gone (destroyed or aborted). Never throws.
  bool released() const noexcept;

  /// Aborts the K communicators and poisons the group with `reason`. Never throws.
  void abort(const std::string& reason) noexcept;

  /// Number of launches so far.
  std::uint64_t seq() const noexcept { return seq_; }
  /// kReplicas: "nccl (K local device(s) 0,1, ranks 2..3 of 4)"; kRank: "nccl (device D, world
  /// size N)".
  std::string describe() const;

 private:
  /// Selects replica r's device (refusing one already taken) and creates its communicator.
  void init_replica(int r, const NcclUniqueId& id, const ErrorContext& ctx);
  /// Checks every call's buffers and root before anything is enqueued.
  void check_calls(const DeviceCall* calls, std::size_t per_replica, const ErrorContext& ctx);
  /// Enqueues calls [begin, end) of every replica, grouped as the role says.
  void enqueue(const DeviceCall* calls, std::size_t per_replica, std::size_t begin, std::size_t end,
               void* const* streams, const ErrorContext& ctx);
  /// The mean's division and one event per replica, recorded on its stream.
  std::vector<NcclEvent> record_events(const DeviceCall* calls, std::size_t per_replica,
                                       void* const* streams, const ErrorContext& ctx);
  /// Finalizes and destroys the K communicators (or aborts them all); caller holds the mutex.
  /// Returns the first failure, or nullptr. Never throws.
  std::exception_ptr finalize_locked() noexcept;
  void check(NativeSource source, int code, const std::string& call, NcclComm comm,
             const ErrorContext& ctx);
  void wait_not_in_progress(const char* what, common::Deadline deadline, const ErrorContext& ctx);

  std::shared_ptr<NcclGroupShared> shared_;
  std::vector<int> devices_;
  std::uint64_t seq_ = 0;
  std::shared_ptr<Work> last_;  // the latest launch's, even if dropped: finalize/destructor wait
};

}  // namespace mwms::collective
