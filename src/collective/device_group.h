// The collective layer's face for the strategy's GPU replicas (Note [gpu replicas] in
// src/strategy/device_replicas.cc): the K local devices of one worker as K ranks of one NCCL
// world of workers x K ranks, created over the strategy's Communicator, and the grouped device
// collectives of the K replicas. The strategy holds a Communicator and this face, nothing of
// collective/backend/ (docs/architecture.md "Strategy"; tests/tools/check_layers.sh checks it).
// The implementation is the NCCL replica group (backend/nccl_group.h).
#pragma once

#include <cstddef>
#include <memory>

#include "mwms/communicator.h"
#include "mwms/types.h"

namespace mwms::collective {

struct NcclApi;  // backend/nccl_api.h: opaque to the strategy, which only passes it on

/// The NCCL table of the real library (collective::real_nccl_api()), or nullptr in a build
/// without NCCL. Never throws.
const NcclApi* default_nccl_api() noexcept;

/// One tensor of one local replica in a grouped device collective: `count` elements of `dtype`
/// in device memory on that replica's device.
struct GroupTensor {
  void* data = nullptr;
  std::size_t count = 0;
  DataType dtype = DataType::kFloat32;
};

/// How DeviceGroup::create lays out the replicas.
struct DeviceGroupOptions {
  int local_replicas = 1;  ///< K: NCCL ranks (and devices) of this worker
  int local_rank = 0;      ///< the worker's local rank: replica r uses device local_rank * K + r
  double timeout_seconds = 300;       ///< per collective (Note [nccl deadlines])
  double init_timeout_seconds = 300;  ///< creation of the K NCCL communicators
};

/// The K NCCL ranks of one worker's GPU replicas. Its collectives are called by one thread at a
/// time (local replica 0's, or the caller's for K = 1) with every replica's tensors; each call
/// blocks until the result is in every replica's device memory.
class DeviceGroup {
 public:
  /// Worker 0 makes the NCCL unique id and broadcasts it (with its status) through `comm`
  /// (Note [nccl unique id]); every worker then creates NCCL ranks comm.rank() * K + r of
  /// comm.world_size() * K on devices local_rank * K + r, in one NCCL group. Blocking,
  /// collective across the workers of `comm`.
  /// @throws InvalidUsage (`api` null: this build has no NCCL; more replicas than devices),
  ///   BackendError (no usable device, or NCCL failed, naming the replica; on every worker when
  ///   worker 0 could not make the id), TimeoutError (a rank never joined within
  ///   init_timeout_seconds), and as Communicator::broadcast.
  static std::unique_ptr<DeviceGroup> create(const NcclApi* api, Communicator& comm,
                                             const DeviceGroupOptions& options);

  /// Waits (bounded by its deadline) for the last collective, then finalizes and destroys the K
  /// NCCL communicators unless finalize() did. Never throws.
  virtual ~DeviceGroup() = default;

  /// The CUDA device of local replica r (0 <= r < K).
  virtual int device(int r) const noexcept = 0;

  /// All-reduces tensor i of every replica (tensors[r * per_replica + i]: replica r's tensor i,
  /// the same counts and dtypes on every replica) with `op`, replica r's calls enqueued on
  /// streams[r] (cudaStream_t as void*; K entries), as one NCCL group; then waits for the result
  /// under the collective's deadline. kMean divides by the number of NCCL ranks. Blocking.
  /// @throws InvalidUsage (poisoned or finalized, carrying the cause), InvalidArgument (null
  ///   buffer with count > 0), BackendError/PeerError from NCCL or CUDA (naming the replica),
  ///   TimeoutError (a peer never called it: all K communicators aborted).
  virtual void all_reduce(const GroupTensor* tensors, std::size_t per_replica, void* const* streams,
                          ReduceOp op) = 0;
  /// Broadcasts tensor i from NCCL rank 0 (worker 0's replica 0) into every replica's tensor i;
  /// otherwise as all_reduce().
  virtual void broadcast(const GroupTensor* tensors, std::size_t per_replica,
                         void* const* streams) = 0;

  /// Finalizes the K NCCL communicators: collective across workers (every worker calls it after
  /// its last collective); waits for the last collective first. Later collectives throw
  /// InvalidUsage; a second call does nothing. Blocking, bounded by the collective timeout.
  /// @throws InvalidUsage (poisoned), the last collective's error, TimeoutError (a worker never
  ///   finalized: all K aborted), PeerError/BackendError (NCCL's).
  virtual void finalize() = 0;

 protected:
  DeviceGroup() = default;
};

}  // namespace mwms::collective
