// GPU replicas' device collectives (ReplicaContext::all_reduce / broadcast_variables with a
// DeviceStream): each replica registers its device tensors and stream, then replica 0 issues the
// whole worker's calls as one NCCL group through strategy::DeviceReplicas (Note [gpu replicas]
// in device_replicas.cc).
#include <chrono>
#include <string>

#include "mwms/errors.h"
#include "mwms/strategy.h"
#include "strategy/device_replicas.h"
#include "strategy/local_replicas.h"
#include "strategy/strategy_impl.h"

namespace mwms {

using strategy::check_tensors;

void MultiWorkerMirroredStrategy::replica_device_collective(const ReplicaContext& ctx, ReduceOp op,
                                                            const std::vector<TensorRef>& tensors,
                                                            DeviceStream stream, bool broadcast) {
  const char* name = broadcast ? "ReplicaContext::broadcast_variables (device)"
                               : "ReplicaContext::all_reduce (device)";
  Impl& m = *impl_;
  if (!m.device_replicas) {
    throw InvalidUsage(std::string(name) +
                       ": this strategy's replicas are on the CPU (ReplicaOptions::device "
                       "kCpu); pass host tensors without a DeviceStream, or use kGpu");
  }
  check_tensors(tensors, name);
  check_no_replica_sync(name);
  const auto start = std::chrono::steady_clock::now();
  const auto r = static_cast<std::size_t>(ctx.local_replica_id);
  // Each replica fills its own slot before the local gather; replica 0 reads them all after it.
  m.device_tensors[r] = &tensors;
  m.device_streams[r] = stream.handle;
  const auto issue = [&] {
    m.device_replicas->run(m.device_tensors, m.device_streams, op, broadcast);
  };
  if (m.replicas) {
    m.replicas->step(ctx.local_replica_id, tensors, name, issue);
  } else {
    issue();
  }
  if (broadcast || r != 0) return;
  m.record_blocking(tensors, start);
}

void ReplicaContext::all_reduce(ReduceOp op, const std::vector<TensorRef>& tensors,
                                DeviceStream stream) const {
  strategy::bound_strategy(strategy_, "ReplicaContext::all_reduce")
      .replica_device_collective(*this, op, tensors, stream, false);
}

void ReplicaContext::broadcast_variables(const std::vector<TensorRef>& variables,
                                         DeviceStream stream) const {
  strategy::bound_strategy(strategy_, "ReplicaContext::broadcast_variables")
      .replica_device_collective(*this, ReduceOp::kSum, variables, stream, true);
}

}  // namespace mwms
