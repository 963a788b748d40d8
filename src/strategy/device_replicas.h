// GPU replicas of one worker (ReplicaOptions::device = kGpu): one NCCL rank per local replica in
// a group of K communicators made through the collective layer's face (collective/device_group.h:
// the NCCL unique id made by worker 0 and sent through the strategy's Communicator), and the
// grouped device collectives that the replica threads' ReplicaContext calls come down to.
// Note [gpu replicas].
#pragma once

#include <memory>
#include <vector>

#include "collective/device_group.h"
#include "mwms/communicator.h"
#include "mwms/strategy.h"

namespace mwms::strategy {

/// The NcclApi the strategy's GPU replicas use: the one set by set_nccl_api_for_testing, else
/// collective::default_nccl_api() (null in a build without NCCL). Never throws.
const collective::NcclApi* replica_nccl_api() noexcept;
/// Makes strategies constructed afterwards use `api` for their GPU replicas (tests: the fake
/// NCCL); nullptr restores the real one. Not thread-safe with a strategy's construction.
void set_nccl_api_for_testing(const collective::NcclApi* api) noexcept;

/// The K NCCL ranks of one worker's GPU replicas. Built by the strategy (collective: every worker
/// builds its own at construction); its collectives are called by one thread at a time (local
/// replica 0's, or the caller's for K = 1) with every replica's tensors.
class DeviceReplicas {
 public:
  /// Makes the K NCCL ranks through collective::DeviceGroup::create (ranks comm.rank() * k + r
  /// of comm.world_size() * k on devices local_rank * k + r; Note [gpu replicas]). Blocking,
  /// collective across workers. @throws as collective::DeviceGroup::create.
  DeviceReplicas(const collective::NcclApi* api, Communicator& comm, int k, int local_rank,
                 double timeout_seconds, double init_timeout_seconds);

  /// The CUDA device of local replica r.
  int device(int r) const noexcept { return group_->device(r); }

  /// All-reduces (`broadcast` false) or broadcasts from NCCL rank 0 (true) tensor i of every
  /// replica, tensors[r] being replica r's list (device memory on its device, same shapes on
  /// every replica) enqueued on streams[r], as one NCCL group; then waits for the result (the
  /// collective's deadline). Tensors of 0 elements are skipped (the same on every replica: shapes
  /// were checked). @throws as collective::DeviceGroup::all_reduce / broadcast.
  void run(const std::vector<const std::vector<TensorRef>*>& tensors,
           const std::vector<void*>& streams, ReduceOp op, bool broadcast);

  /// Finalizes the K NCCL communicators (collective across workers).
  /// @throws as collective::DeviceGroup::finalize.
  void finalize() { group_->finalize(); }

 private:
  std::unique_ptr<collective::DeviceGroup> group_;
  std::vector<collective::GroupTensor> tensors_;  // capacity reused
};

}  // namespace mwms::strategy
