// GPU replicas: the NCCL side of ReplicaOptions::device = kGpu.
//
// Note [gpu replicas]: TF's MirroredStrategy model — one process drives K local GPUs, one thread
// per replica (the LocalReplicas threads of Note [local replicas]; K = 1: the caller's thread).
// Every local replica is an NCCL rank of its own: the world is workers x K NCCL ranks, local
// replica r of worker w is rank w * K + r on CUDA device local_rank * K + r (local_rank from the
// launcher: 0 when one process drives all of a host's GPUs), so one NCCL communicator of the whole
// world replaces the CPU path's two steps (local reduce, then across workers): NCCL's own
// topology-aware algorithms reduce across the host's GPUs and the network at once. The K
// communicators of a worker are created in one NCCL group from one unique id, made by worker 0
// and sent to every worker through the strategy's Communicator (any launcher: TF_CONFIG, mpirun,
// Slurm, torchrun) together with worker 0's status, so a failure there fails everyone at once. A
// device collective of the replicas (ReplicaContext::all_reduce / broadcast_variables with a
// DeviceStream) is a local collective of the K threads (LocalReplicas::step: shapes checked, the
// others' deadline re-armed while replica 0 works) in which replica 0 alone issues every
// replica's NCCL calls in one group (NCCL requires it when one thread drives several devices) on
// each replica's stream, then waits for the K events under the collective's deadline (Note [nccl
// replica group] in src/collective/backend/nccl_group.h, reached through the collective layer's
// face, collective/device_group.h). Each replica's buffers then hold the result, on its own
// device: no copy back. Broadcast is from NCCL rank 0, the chief's local replica 0. Host tensors
// keep the CPU path, so a GPU-replica step can still reduce host-side metrics with the plain
// ReplicaContext calls. Tested without a GPU over the fake NCCL: one worker's K replicas
// (device_replicas_test.cc) and W worker processes x K replicas as one NCCL world
// (tests/multiproc/gpu_replicas_test.cc).
#include "strategy/device_replicas.h"

#include <atomic>

namespace mwms::strategy {

namespace {

std::atomic<const collective::NcclApi*> g_test_api{nullptr};

}  // namespace

const collective::NcclApi* replica_nccl_api() noexcept {
  if (const collective::NcclApi* api = g_test_api.load()) return api;
  return collective::default_nccl_api();
}

void set_nccl_api_for_testing(const collective::NcclApi* api) noexcept { g_test_api.store(api); }

DeviceReplicas::DeviceReplicas(const collective::NcclApi* api, Communicator& comm, int k,
                               int local_rank, double timeout_seconds,
                               double init_timeout_seconds) {
  collective::DeviceGroupOptions o;
  o.local_replicas = k;
  o.local_rank = local_rank;
  o.timeout_seconds = timeout_seconds;
  o.init_timeout_seconds = init_timeout_seconds;
  group_ = collective::DeviceGroup::create(api, comm, o);
}

void DeviceReplicas::run(const std::vector<const std::vector<TensorRef>*>& tensors,
                         const std::vector<void*>& streams, ReduceOp op, bool broadcast) {
  const std::vector<TensorRef>& first = *tensors[0];
  tensors_.clear();
  std::size_t per_replica = 0;
  for (std::size_t t = 0; t < first.size(); ++t) per_replica += first[t].count > 0 ? 1 : 0;
  if (per_replica == 0) return;
  for (const std::vector<TensorRef>* replica : tensors) {
    for (const TensorRef& t : *replica) {
      if (t.count == 0) continue;  // the same tensors on every replica (shapes checked)
      tensors_.push_back({t.data, t.count, t.dtype});
    }
  }
  if (broadcast) {
    group_->broadcast(tensors_.data(), per_replica, streams.data());
  } else {
    group_->all_reduce(tensors_.data(), per_replica, streams.data(), op);
  }
}

}  // namespace mwms::strategy
