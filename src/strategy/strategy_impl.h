// MultiWorkerMirroredStrategy's private state, shared by the files that implement it:
//   multi_worker_mirrored_strategy.cc  construction, accessors, run(), the blocking collectives
//                                      (K = 1 and K > 1 local replicas), scalars, shards, stats
//   overlap.cc                         the overlapped step with K = 1 (Note [overlapped buckets])
//   replica_overlap.cc                 the overlapped step with K > 1 and ReplicaContext's
//                                      begin/ready/finish calls (Note [overlapped replica buckets])
//   replica_device_collectives.cc      GPU replicas' device collectives (ReplicaContext calls)
//   device_replicas.cc                 the GPU replicas' NCCL ranks (Note [gpu replicas])
//   buckets.cc                         the bucket plan, packing and the bucketed all-reduce
// Private to src/strategy: nothing outside it includes this header.
#pragma once

#include <chrono>
#include <cstddef>
#include <exception>
#include <memory>
#include <mutex>
#include <vector>

#include "mwms/communicator.h"
#include "mwms/strategy.h"
#include "strategy/device_replicas.h"
#include "strategy/local_replicas.h"

namespace mwms {

/// One bucket of an overlapped step (begin_gradient_sync): tensors [first, last) of the list.
/// Owned by MultiWorkerMirroredStrategy::Impl; with K > 1 guarded by Impl::replica_mu.
struct SyncBucket {
  std::size_t first = 0;
  std::size_t last = 0;
  std::size_t bytes = 0;
  DataType wire = DataType::kFloat32;  // on the wire (strategy::wire_type)
  bool in_place = true;      // reduced where the tensors lie; otherwise through `pack`
  std::vector<char> pack;    // this bucket's own staging (buckets are in flight together)
  std::size_t waiting = 0;   // tensors not ready yet (K = 1)
  int replicas_left = 0;     // K > 1: local replicas that have not made all its tensors ready
  bool reduced = false;      // ready to start: complete (K = 1) or reduced across the replicas
  std::shared_ptr<Work> work;
};

/// The strategy's state. Used by the strategy's thread (K = 1), or by the K local replica
/// threads inside run(): then the overlapped-step fields are guarded by replica_mu, and the
/// communicator, pack and statistics are touched by replica 0 only (Note [local replicas]).
struct MultiWorkerMirroredStrategy::Impl {
  CommunicationOptions options;
  std::unique_ptr<Communicator> comm;
  std::vector<char> pack;  // bucket staging, grown once to bytes_per_pack
  double all_reduce_seconds = 0;
  double exposed_seconds = 0;
  std::size_t all_reduce_bytes = 0;

  // Overlapped step (Note [overlapped buckets]).
  bool sync_active = false;
  ReduceOp sync_op = ReduceOp::kSum;
  std::vector<TensorRef> sync_tensors;
  std::vector<std::size_t> bucket_of;  // per tensor
  std::vector<bool> ready;             // per tensor
  std::vector<SyncBucket> buckets;
  std::size_t next_launch = 0;         // buckets [0, next_launch) have started
  std::chrono::steady_clock::time_point first_launch;
  bool launched_any = false;

  // Local replicas (null for K = 1: no thread, no copy).
  int local_replicas = 1;
  std::unique_ptr<strategy::LocalReplicas> replicas;
  bool in_run = false;  // K = 1: run() is active

  // Overlapped step of K > 1 local replicas (Note [overlapped replica buckets]): the bucket plan
  // above (buckets, bucket_of, next_launch, ...) is shared, built from replica 0's list.
  std::mutex replica_mu;      // the fields below, bucket state, and every launch (the communicator)
  bool replica_sync = false;  // between begin and finish
  bool replica_mean = false;  // kMean: divide in finish
  std::vector<std::vector<TensorRef>> replica_tensors;    // per replica, its list
  std::vector<ReduceOp> replica_op;                       // per replica, its op
  std::vector<std::vector<char>> replica_ready;           // per replica, per tensor
  std::vector<std::vector<std::size_t>> replica_waiting;  // per replica, per bucket

  // GPU replicas (ReplicaDevice::kGpu; Note [gpu replicas]); null for kCpu.
  std::unique_ptr<strategy::DeviceReplicas> device_replicas;
  std::vector<const std::vector<TensorRef>*> device_tensors;  // per replica, during a call
  std::vector<void*> device_streams;                          // per replica, during a call

  /// Builds the bucket plan of `gradients` (kept when the list is the one of the previous step:
  /// nothing allocated once the pack buffers have grown) and resets the per-step state, each
  /// bucket waiting for `replicas_per_bucket` replicas (1 for K = 1). K > 1: called by replica 0
  /// under replica_mu. Throws only std::bad_alloc. (overlap.cc)
  void plan_sync(const std::vector<TensorRef>& gradients, ReduceOp op, int replicas_per_bucket);
  /// Starts, in list order, every bucket that is reduced and whose predecessors have started
  /// (Note [overlapped buckets]). K > 1: called under replica_mu. Does not block; throws as
  /// Communicator::all_reduce_async. (overlap.cc)
  void launch_ready_buckets();
  /// Waits for every started bucket of the step (each under the communicator's deadline) and
  /// unpacks the packed ones into sync_tensors while no error has been seen; keeps in `error`
  /// the first failure (unless it already holds one) and goes on waiting, so that no bucket is
  /// left in flight. Reads each bucket's work under replica_mu; the caller must not hold it.
  /// (overlap.cc)
  void wait_started_buckets(std::exception_ptr& error);
  /// Adds a blocking collective of `tensors` begun at `start` to the statistics: its bytes, and
  /// the time until now as both all-reduce and exposed time. The strategy's thread only (replica
  /// 0 with K > 1). Never throws. (multi_worker_mirrored_strategy.cc)
  void record_blocking(const std::vector<TensorRef>& tensors,
                       std::chrono::steady_clock::time_point start) noexcept;
};

namespace strategy {

/// Throws InvalidArgument naming `what` and the tensor index when a tensor has null data and a
/// nonzero count. Never blocks.
void check_tensors(const std::vector<TensorRef>& tensors, const char* what);

/// The strategy a ReplicaContext call forwards to: `strategy` itself, or InvalidUsage naming `op`
/// when it is null (a context not passed by MultiWorkerMirroredStrategy::run()). Never blocks.
MultiWorkerMirroredStrategy& bound_strategy(MultiWorkerMirroredStrategy* strategy, const char* op);

}  // namespace strategy
}  // namespace mwms
