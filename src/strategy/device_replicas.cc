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
// replica group]). Each replica's buffers then hold the result, on its own device: no copy back.
// Broadcast is from NCCL rank 0, the chief's local replica 0. Host tensors keep the CPU path, so
// a GPU-replica step can still reduce host-side metrics with the plain ReplicaContext calls.
// Tested without a GPU over the fake NCCL: one worker's K replicas (device_replicas_test.cc) and
// W worker processes x K replicas as one NCCL world (tests/multiproc/gpu_replicas_test.cc).
#include "strategy/device_replicas.h"

#include <array>
#include <atomic>
#include <cstring>
#include <string>

#include "mwms/errors.h"

namespace mwms::strategy {

namespace {

std::atomic<const collective::NcclApi*> g_test_api{nullptr};

}  // namespace

const collective::NcclApi* replica_nccl_api() noexcept {
  if (const collective::NcclApi* api = g_test_api.load()) return api;
  return collective::real_nccl_api();
}

void set_nccl_api_for_testing(const collective::NcclApi* api) noexcept { g_test_api.store(api); }

DeviceReplicas::DeviceReplicas(const collective::NcclApi* api, Communicator& comm, int k,
                               int local_rank, double timeout_seconds,
                               double init_timeout_seconds) {
  ErrorContext ctx;
  ctx.rank = comm.rank();
  ctx.world_size = comm.world_size();
  ctx.task = comm.cluster().task_name();
  ctx.op = "GPU replicas";
  if (api == nullptr) {
    throw InvalidUsage(
        "ReplicaOptions::device = kGpu needs a build with NCCL (MWMS_WITH_CUDA=ON and NCCL "
        "found); this build has none: use ReplicaDevice::kCpu",
        ctx);
  }
  // Worker 0's status (an ncclResult_t) and the id, as 33 int32: one broadcast.
  std::array<std::int32_t, 1 + sizeof(collective::NcclUniqueId::bytes) / 4> message{};
  collective::NcclUniqueId id;
  if (comm.rank() == 0) {
    message[0] = api->get_unique_id(&id);
    std::memcpy(&message[1], id.bytes.data(), id.bytes.size());
  }
  comm.broadcast(message.data(), message.size(), DataType::kInt32, 0);
  if (message[0] != collective::kNcclSuccess) {
    if (comm.rank() == 0) {
      std::rethrow_exception(collective::to_error(*api, collective::NativeSource::kNccl, message[0],
                                                  "ncclGetUniqueId", nullptr, ctx));
    }
    throw BackendError(
        "worker 0 could not make the NCCL unique id of the GPU replicas (NCCL "
        "error " +
            std::to_string(message[0]) + "; see worker 0's error)",
        message[0], ctx);
  }
  std::memcpy(id.bytes.data(), &message[1], id.bytes.size());
  collective::NcclGroupOptions o;
  o.first_rank = comm.rank() * k;
  o.world_size = comm.world_size() * k;
  for (int r = 0; r < k; ++r) o.devices.push_back(local_rank * k + r);
  o.timeout_seconds = timeout_seconds;
  o.init_timeout_seconds = init_timeout_seconds;
  o.context = ctx;
  o.context.op.clear();
  group_ = std::make_unique<collective::NcclReplicaGroup>(*api, id, std::move(o));
}

void DeviceReplicas::run(const std::vector<const std::vector<TensorRef>*>& tensors,
                         const std::vector<void*>& streams, ReduceOp op, bool broadcast) {
  const std::size_t k = tensors.size();
  const std::vector<TensorRef>& first = *tensors[0];
  calls_.clear();
  std::size_t per_replica = 0;
  for (std::size_t t = 0; t < first.size(); ++t) per_replica += first[t].count > 0 ? 1 : 0;
  if (per_replica == 0) return;
  for (std::size_t r = 0; r < k; ++r) {
    for (const TensorRef& t : *tensors[r]) {
      if (t.count == 0) continue;  // the same tensors on every replica (shapes checked)
      collective::DeviceCall c;
      c.kind = broadcast ? collective::DeviceCollective::kBroadcast
                         : collective::DeviceCollective::kAllReduce;
      c.send = t.data;
      c.recv = t.data;
      c.count = t.count;
      c.dtype = t.dtype;
      c.op = op;
      c.root = 0;
      calls_.push_back(c);
    }
  }
  group_->launch(calls_.data(), per_replica, streams.data())->wait();
}

}  // namespace mwms::strategy
