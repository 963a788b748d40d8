// MultiWorkerMirroredStrategy: K local replicas per worker (Note [local replicas] in
// local_replicas.cc; K = 1 runs on the calling thread), gradients packed into buckets of
// bytes_per_pack and all-reduced through the Communicator, blocking or overlapped with backprop
// (Note [overlapped buckets], Note [overlapped replica buckets]); GPU replicas' device buffers
// through NCCL (Note [gpu replicas] in device_replicas.cc). The strategy never touches sockets.
//
// This file: construction (the K check), accessors, run(), the blocking collectives (K = 1:
// all_reduce_gradients; K > 1: replica_all_reduce / _broadcast), scalars, shards, finalize and
// statistics. The rest (the state: strategy_impl.h): the bucket helpers in buckets.cc, the
// overlapped step with K = 1 in overlap.cc (Note [overlapped buckets]) and with K > 1 in
// replica_overlap.cc (Note [overlapped replica buckets]), GPU replicas' device collectives in
// replica_device_collectives.cc (the GPU replicas themselves: device_replicas.cc).
#include <algorithm>
#include <chrono>
#include <mutex>
#include <string>

#include "bootstrap/error_context.h"
#include "collective/option_values.h"
#include "common/env.h"
#include "common/logging.h"
#include "kernels/reduce.h"
#include "mwms/errors.h"
#include "mwms/strategy.h"
#include "strategy/buckets.h"
#include "strategy/device_replicas.h"
#include "strategy/local_replicas.h"
#include "strategy/strategy_impl.h"

namespace mwms {

using strategy::bucketed_all_reduce;
using strategy::check_tensors;

namespace {

// Every optional field set to the value in effect (Note [option sentinels]).
CommunicationOptions effective(const CommunicationOptions& in) {
  CommunicationOptions out = in;
  out.bytes_per_pack = static_cast<std::size_t>(collective::bytes_option(
      in.bytes_per_pack, "CommunicationOptions::bytes_per_pack", "MWMS_BYTES_PER_PACK"));
  out.timeout_seconds = collective::seconds_option(
      in.timeout_seconds, "CommunicationOptions::timeout_seconds", "MWMS_TIMEOUT_SECONDS");
  return out;
}

}  // namespace

void strategy::check_tensors(const std::vector<TensorRef>& tensors, const char* what) {
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].data == nullptr && tensors[i].count > 0) {
      throw InvalidArgument(std::string(what) + ": tensor " + std::to_string(i) +
                            " has null data and count " + std::to_string(tensors[i].count));
    }
  }
}

MultiWorkerMirroredStrategy& strategy::bound_strategy(MultiWorkerMirroredStrategy* strategy,
                                                      const char* op) {
  if (strategy == nullptr) {
    throw InvalidUsage(std::string(op) +
                       ": this context was not passed by MultiWorkerMirroredStrategy::run()");
  }
  return *strategy;
}

void MultiWorkerMirroredStrategy::Impl::record_blocking(
    const std::vector<TensorRef>& tensors, std::chrono::steady_clock::time_point start) noexcept {
  for (const TensorRef& g : tensors) all_reduce_bytes += g.count * dtype_size(g.dtype);
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  all_reduce_seconds += took;
  exposed_seconds += took;  // blocking: nothing hides it
}

MultiWorkerMirroredStrategy::MultiWorkerMirroredStrategy(const CommunicationOptions& options)
    : MultiWorkerMirroredStrategy(resolve_from_environment(), options) {}

MultiWorkerMirroredStrategy::MultiWorkerMirroredStrategy(const ResolvedCluster& cluster,
                                                         const CommunicationOptions& options)
    : MultiWorkerMirroredStrategy(cluster, options, ReplicaOptions{}) {}

namespace {

constexpr int kMaxLocalReplicas = 64;

// Every worker must drive the same K (replica ids and shards are computed from it) on the same
// kind of device (GPU replicas create NCCL communicators together): one all_gather of each
// worker's (K, device), so a disagreement names the workers instead of surfacing as a
// mismatched collective later.
void check_same_local_replicas(Communicator& comm, int k, ReplicaDevice device) {
  if (comm.world_size() == 1) return;
  std::vector<std::int32_t> all(2 * static_cast<std::size_t>(comm.world_size()));
  const std::int32_t mine[2] = {k, device == ReplicaDevice::kGpu ? 1 : 0};
  comm.all_gather(mine, all.data(), 2, DataType::kInt32);
  const auto name = [](std::int32_t d) { return d == 1 ? "kGpu" : "kCpu"; };
  for (int r = 0; r < comm.world_size(); ++r) {
    const std::int32_t theirs = all[2 * static_cast<std::size_t>(r) + 1];
    if (theirs != mine[1]) {
      throw InvalidArgument("ReplicaOptions::device differs between workers: worker " +
                            std::to_string(comm.rank()) + " has " + name(mine[1]) + ", worker " +
                            std::to_string(r) + " has " + name(theirs));
    }
  }
  for (int r = 0; r < comm.world_size(); ++r) {
    if (all[2 * static_cast<std::size_t>(r)] == mine[0]) continue;
    throw InvalidArgument("ReplicaOptions::local_replicas differs between workers: worker " +
                          std::to_string(comm.rank()) + " has " + std::to_string(mine[0]) +
                          ", worker " + std::to_string(r) + " has " +
                          std::to_string(all[2 * static_cast<std::size_t>(r)]) +
                          " (every worker must drive the same number of local replicas)");
  }
}

}  // namespace

MultiWorkerMirroredStrategy::MultiWorkerMirroredStrategy(const ResolvedCluster& cluster,
                                                         const CommunicationOptions& options,
                                                         const ReplicaOptions& replicas)
    : impl_(std::make_unique<Impl>()) {
  if (replicas.local_replicas < 1 || replicas.local_replicas > kMaxLocalReplicas) {
    throw InvalidArgument("ReplicaOptions::local_replicas must be in [1, " +
                          std::to_string(kMaxLocalReplicas) + "], got " +
                          std::to_string(replicas.local_replicas));
  }
  impl_->options = effective(options);
  impl_->local_replicas = replicas.local_replicas;
  CommunicatorOptions copts;
  copts.timeout_seconds = impl_->options.timeout_seconds;
  copts.implementation = impl_->options.implementation;
  impl_->comm = Communicator::create(cluster, copts);
  check_same_local_replicas(*impl_->comm, impl_->local_replicas, replicas.device);
  if (replicas.device == ReplicaDevice::kGpu) {
    impl_->device_replicas = std::make_unique<strategy::DeviceReplicas>(
        strategy::replica_nccl_api(), *impl_->comm, impl_->local_replicas,
        impl_->comm->cluster().local_rank, *impl_->options.timeout_seconds,
        common::env_double("MWMS_CONNECT_TIMEOUT_SECONDS"));
    impl_->device_tensors.assign(static_cast<std::size_t>(impl_->local_replicas), nullptr);
    impl_->device_streams.assign(static_cast<std::size_t>(impl_->local_replicas), nullptr);
  }
  if (impl_->local_replicas > 1) {
    const ErrorContext ctx = bootstrap::task_context(impl_->comm->cluster(), "");
    impl_->replicas = std::make_unique<strategy::LocalReplicas>(
        impl_->local_replicas, *impl_->options.timeout_seconds, impl_->comm->rank(), ctx);
  }
  MWMS_LOG_INFO(kStrat, "MultiWorkerMirroredStrategy: num_replicas_in_sync "
                            << num_replicas_in_sync() << " (" << num_workers() << " worker(s) x "
                            << impl_->local_replicas << " local replica(s)), bytes_per_pack "
                            << *impl_->options.bytes_per_pack);
}

MultiWorkerMirroredStrategy::~MultiWorkerMirroredStrategy() = default;

int MultiWorkerMirroredStrategy::num_replicas_in_sync() const noexcept {
  return impl_->comm->world_size() * impl_->local_replicas;
}
int MultiWorkerMirroredStrategy::num_local_replicas() const noexcept {
  return impl_->local_replicas;
}
int MultiWorkerMirroredStrategy::num_workers() const noexcept { return impl_->comm->world_size(); }
int MultiWorkerMirroredStrategy::worker_index() const noexcept { return impl_->comm->rank(); }
bool MultiWorkerMirroredStrategy::is_chief() const noexcept {
  return impl_->comm->cluster().is_chief;
}
const ResolvedCluster& MultiWorkerMirroredStrategy::cluster() const noexcept {
  return impl_->comm->cluster();
}
const CommunicationOptions& MultiWorkerMirroredStrategy::options() const noexcept {
  return impl_->options;
}
Communicator& MultiWorkerMirroredStrategy::communicator() { return *impl_->comm; }

void MultiWorkerMirroredStrategy::broadcast_variables(const std::vector<TensorRef>& variables) {
  check_tensors(variables, "broadcast_variables");
  // The chief holds the leader's values (rank 0 is always the chief / worker 0).
  for (const TensorRef& v : variables) impl_->comm->broadcast(v.data, v.count, v.dtype, 0);
}

void MultiWorkerMirroredStrategy::run(const std::function<void(const ReplicaContext&)>& fn) {
  const int k = impl_->local_replicas;
  const auto context = [&](int local) {
    ReplicaContext ctx;
    ctx.replica_id_in_sync_group = worker_index() * k + local;
    ctx.num_replicas_in_sync = num_replicas_in_sync();
    ctx.local_replica_id = local;
    ctx.num_local_replicas = k;
    ctx.device = impl_->device_replicas ? impl_->device_replicas->device(local) : -1;
    ctx.strategy_ = this;
    return ctx;
  };
  if (impl_->replicas) {
    try {
      impl_->replicas->run([&](int local) { fn(context(local)); });
    } catch (...) {
      drain_replica_sync();  // the started buckets' buffers are the replicas' tensors
      throw;
    }
    bool unfinished = false;
    {
      std::lock_guard<std::mutex> lock(impl_->replica_mu);
      unfinished = impl_->replica_sync;
    }
    if (unfinished) {
      drain_replica_sync();
      throw InvalidUsage(
          "MultiWorkerMirroredStrategy::run: the replica functions returned between "
          "ReplicaContext::begin_gradient_sync and finish_gradient_sync; every replica must "
          "finish its overlapped step inside the same run()");
    }
    return;
  }
  // K = 1: on this thread, as before local replicas existed.
  if (impl_->in_run)
    throw InvalidUsage("MultiWorkerMirroredStrategy::run called from inside run()");
  impl_->in_run = true;
  try {
    fn(context(0));
  } catch (...) {
    impl_->in_run = false;
    throw;
  }
  impl_->in_run = false;
}

void MultiWorkerMirroredStrategy::replica_all_reduce(const ReplicaContext& ctx, ReduceOp op,
                                                     const std::vector<TensorRef>& tensors) {
  if (!impl_->replicas) {
    all_reduce_gradients(tensors, op);  // K = 1: in place, nothing local to do
    return;
  }
  check_tensors(tensors, "ReplicaContext::all_reduce");
  check_no_replica_sync("ReplicaContext::all_reduce");
  const auto start = std::chrono::steady_clock::now();
  Impl& m = *impl_;
  const int replicas = num_replicas_in_sync();
  // The local step sums (kernels::reduce treats kMean as kSum); the mean divides once, by every
  // replica, after the cross-worker sum, so it rounds once as a single replica's kMean does.
  const ReduceOp across_op = op == ReduceOp::kMean ? ReduceOp::kSum : op;
  m.replicas->all_reduce(ctx.local_replica_id, tensors, op,
                         [&](const std::vector<TensorRef>& mine) {
                           bucketed_all_reduce(*m.comm, m.options, m.pack, mine, across_op);
                           if (op == ReduceOp::kMean) {
                             for (const TensorRef& t : mine)
                               kernels::scale_divide(t.data, t.count, t.dtype, replicas);
                           }
                         });
  if (ctx.local_replica_id != 0) return;
  // Replica 0 runs on the strategy's thread: it alone updates the statistics, counting the whole
  // collective (waiting for the other replicas included) as exposed all-reduce time.
  m.record_blocking(tensors, start);
}

void MultiWorkerMirroredStrategy::replica_broadcast(const ReplicaContext& ctx,
                                                    const std::vector<TensorRef>& variables) {
  if (!impl_->replicas) {
    broadcast_variables(variables);
    return;
  }
  check_tensors(variables, "ReplicaContext::broadcast_variables");
  check_no_replica_sync("ReplicaContext::broadcast_variables");
  impl_->replicas->broadcast(
      ctx.local_replica_id, variables,
      [&](const std::vector<TensorRef>& mine) { broadcast_variables(mine); });
}

void ReplicaContext::all_reduce(ReduceOp op, const std::vector<TensorRef>& tensors) const {
  strategy::bound_strategy(strategy_, "ReplicaContext::all_reduce")
      .replica_all_reduce(*this, op, tensors);
}

void ReplicaContext::broadcast_variables(const std::vector<TensorRef>& variables) const {
  strategy::bound_strategy(strategy_, "ReplicaContext::broadcast_variables")
      .replica_broadcast(*this, variables);
}

namespace {

// Rows of part `i` of `parts` near-equal contiguous parts of `rows` rows.
Shard split_rows(std::size_t rows, std::size_t parts, std::size_t i) {
  const std::size_t base = rows / parts;
  const std::size_t rem = rows % parts;
  Shard s;
  s.begin = i * base + std::min(i, rem);
  s.end = s.begin + base + (i < rem ? 1 : 0);
  return s;
}

}  // namespace

Shard ReplicaContext::batch_shard(std::size_t global_batch_size) const noexcept {
  return split_rows(global_batch_size, static_cast<std::size_t>(num_replicas_in_sync),
                    static_cast<std::size_t>(replica_id_in_sync_group));
}

void MultiWorkerMirroredStrategy::all_reduce_gradients(const std::vector<TensorRef>& gradients,
                                                       ReduceOp op) {
  check_tensors(gradients, "all_reduce_gradients");
  auto start = std::chrono::steady_clock::now();
  bucketed_all_reduce(*impl_->comm, impl_->options, impl_->pack, gradients, op);
  impl_->record_blocking(gradients, start);
}

double MultiWorkerMirroredStrategy::exposed_all_reduce_seconds() const noexcept {
  return impl_->exposed_seconds;
}

double MultiWorkerMirroredStrategy::reduce(ReduceOp op, double value) {
  impl_->comm->all_reduce(&value, 1, DataType::kFloat64, op);
  return value;
}

Shard MultiWorkerMirroredStrategy::batch_shard(std::size_t global_batch_size) const noexcept {
  // The union of this worker's replicas' rows (K = 1: exactly the per-worker split).
  const std::size_t k = static_cast<std::size_t>(impl_->local_replicas);
  const std::size_t parts = static_cast<std::size_t>(num_replicas_in_sync());
  const std::size_t first = static_cast<std::size_t>(worker_index()) * k;
  Shard s;
  s.begin = split_rows(global_batch_size, parts, first).begin;
  s.end = split_rows(global_batch_size, parts, first + k - 1).end;
  return s;
}

void MultiWorkerMirroredStrategy::finalize() {
  if (impl_->sync_active) {
    throw InvalidUsage("finalize called between begin_gradient_sync and finish_gradient_sync; "
                       "finish the step first");
  }
  // GPU replicas: their NCCL world first (every worker is here, after its last step), then the
  // workers' communicator, whose barrier and notices end the job in order.
  if (impl_->device_replicas) impl_->device_replicas->finalize();
  impl_->comm->finalize();
}

double MultiWorkerMirroredStrategy::all_reduce_seconds() const noexcept {
  return impl_->all_reduce_seconds;
}
std::size_t MultiWorkerMirroredStrategy::all_reduce_bytes() const noexcept {
  return impl_->all_reduce_bytes;
}

}  // namespace mwms
