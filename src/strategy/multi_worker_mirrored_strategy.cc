// MultiWorkerMirroredStrategy: K local replicas per worker (Note [local replicas] in
// local_replicas.cc; K = 1 runs on the calling thread), gradients packed into buckets of
// bytes_per_pack and all-reduced through the Communicator, blocking or overlapped with backprop
// (Note [overlapped buckets], Note [overlapped replica buckets]); GPU replicas' device buffers
// through NCCL (Note [gpu replicas] in device_replicas.cc). The strategy never touches sockets.
//
// The file in order (search for the first line of each):
//   (the state, MultiWorkerMirroredStrategy::Impl: strategy_impl.h; bucket helpers: buckets.cc)
//   check_same_local_replicas                   the K check, the constructors, accessors
//   MultiWorkerMirroredStrategy::run            K local replicas; replica_all_reduce/_broadcast
//   Note [overlapped replica buckets]           the overlapped step with K > 1 (replica_*_sync)
//   replica_device_collective                   GPU replicas' collectives (device_replicas.cc)
//   ReplicaContext::                            the public ReplicaContext calls, forwarding here
//   all_reduce_gradients                        the blocking bucketed all-reduce (K = 1)
//   Note [overlapped buckets]                   the overlapped step with K = 1 (plan_sync, ...)
//   MultiWorkerMirroredStrategy::reduce         scalars, shards, finalize, statistics
#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>

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
using strategy::contiguous_tensors;
using strategy::for_each_bucket;
using strategy::pack_tensors;
using strategy::solo_bytes;
using strategy::unpack_tensors;
using strategy::wire_type;

namespace {

CommunicationOptions effective(const CommunicationOptions& in) {
  CommunicationOptions out = in;
  if (out.bytes_per_pack == 0) {
    out.bytes_per_pack = static_cast<std::size_t>(common::env_int("MWMS_BYTES_PER_PACK"));
  }
  if (out.timeout_seconds <= 0) out.timeout_seconds = common::env_double("MWMS_TIMEOUT_SECONDS");
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
        impl_->comm->cluster().local_rank, impl_->options.timeout_seconds,
        common::env_double("MWMS_CONNECT_TIMEOUT_SECONDS"));
    impl_->device_tensors.assign(static_cast<std::size_t>(impl_->local_replicas), nullptr);
    impl_->device_streams.assign(static_cast<std::size_t>(impl_->local_replicas), nullptr);
  }
  if (impl_->local_replicas > 1) {
    ErrorContext ctx;
    ctx.rank = impl_->comm->rank();
    ctx.world_size = impl_->comm->world_size();
    ctx.task = impl_->comm->cluster().task_name();
    impl_->replicas = std::make_unique<strategy::LocalReplicas>(
        impl_->local_replicas, impl_->options.timeout_seconds, impl_->comm->rank(), ctx);
  }
  MWMS_LOG_INFO(kStrat, "MultiWorkerMirroredStrategy: num_replicas_in_sync "
                            << num_replicas_in_sync() << " (" << num_workers() << " worker(s) x "
                            << impl_->local_replicas << " local replica(s)), bytes_per_pack "
                            << impl_->options.bytes_per_pack);
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
  for (const TensorRef& g : tensors) m.allreduce_bytes += g.count * dtype_size(g.dtype);
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  m.allreduce_seconds += took;
  m.exposed_seconds += took;
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

// Note [overlapped replica buckets]: the overlapped step of K > 1 local replicas
// (ReplicaContext::begin_gradient_sync / gradient_ready / finish_gradient_sync) is the
// per-worker overlapped step of Note [overlapped buckets] with a local reduction in front:
//   - begin is a local collective (LocalReplicas::step): every replica registers its list (a
//     copy, kept by the strategy for the step), replica 0 checks the ops and builds the bucket
//     plan from its own list (the plan the strategy's begin_gradient_sync would build);
//   - each replica counts, per bucket, its tensors not ready yet; the replica whose
//     gradient_ready completes a bucket on the LAST of the K replicas (a shared per-bucket
//     count, under replica_mu) reduces that bucket alone, on its own thread, into replica 0's
//     tensors in replica order (element i is ((t0 op t1) op t2) ...: the bits of the
//     non-overlapped ReplicaContext::all_reduce, whichever thread does it and whenever), then,
//     under replica_mu, marks it reduced and starts every reduced bucket whose predecessors have
//     started, so buckets start in list order on every worker and the communicator is called by
//     one thread at a time; the all-reduces run on the communicator's progress thread while the
//     replicas' backprop goes on;
//   - finish marks the replica's remaining tensors ready, then a local collective
//     (LocalReplicas::share): replica 0 waits for every bucket (the communicator's deadline;
//     the other replicas' local deadline is re-armed meanwhile), unpacks, divides for kMean (the
//     local and cross-worker steps sum; one division by num_replicas_in_sync, as the
//     non-overlapped path), and the others copy replica 0's result into their own tensors.
// A replica that fails mid-step leaves buckets that will never complete locally: its siblings
// fail in their next local wait (ReplicaError naming it), and run() waits for the buckets that
// did start (drain_replica_sync: their buffers are the replicas' tensors) before it rethrows.
void MultiWorkerMirroredStrategy::check_no_replica_sync(const char* op) {
  std::lock_guard<std::mutex> lock(impl_->replica_mu);
  if (impl_->replica_sync) {
    throw InvalidUsage(std::string(op) +
                       " called between ReplicaContext::begin_gradient_sync and "
                       "finish_gradient_sync: finish the overlapped step first");
  }
}

void MultiWorkerMirroredStrategy::replica_begin_sync(const ReplicaContext& ctx,
                                                     const std::vector<TensorRef>& gradients,
                                                     ReduceOp op) {
  if (!impl_->replicas) {
    begin_gradient_sync(gradients, op);
    return;
  }
  Impl& m = *impl_;
  const auto r = static_cast<std::size_t>(ctx.local_replica_id);
  check_tensors(gradients, "ReplicaContext::begin_gradient_sync");
  {
    std::lock_guard<std::mutex> lock(m.replica_mu);
    if (m.replica_sync) {
      throw InvalidUsage("ReplicaContext::begin_gradient_sync called again by local replica " +
                         std::to_string(r) + " before finish_gradient_sync");
    }
    if (m.replica_tensors.size() != static_cast<std::size_t>(m.local_replicas)) {
      m.replica_tensors.resize(static_cast<std::size_t>(m.local_replicas));
      m.replica_op.resize(static_cast<std::size_t>(m.local_replicas));
      m.replica_ready.resize(static_cast<std::size_t>(m.local_replicas));
      m.replica_waiting.resize(static_cast<std::size_t>(m.local_replicas));
    }
    // Capacity reused from the previous step: nothing allocated once grown.
    m.replica_tensors[r].assign(gradients.begin(), gradients.end());
    m.replica_op[r] = op;
  }
  m.replicas->step(ctx.local_replica_id, gradients, "ReplicaContext::begin_gradient_sync", [&] {
    // Replica 0, once every replica has registered its list (shapes checked).
    std::lock_guard<std::mutex> lock(m.replica_mu);
    if (m.sync_active) {
      throw InvalidUsage(
          "ReplicaContext::begin_gradient_sync called while the strategy's own "
          "begin_gradient_sync step is active");
    }
    for (std::size_t j = 1; j < m.replica_op.size(); ++j) {
      if (m.replica_op[j] != m.replica_op[0]) {
        throw InvalidArgument(
            "ReplicaContext::begin_gradient_sync: local replica " + std::to_string(j) +
            " passed op " + std::string(to_string(m.replica_op[j])) + ", local replica 0 passed " +
            std::string(to_string(m.replica_op[0])));
      }
    }
    m.replica_mean = op == ReduceOp::kMean;
    m.plan_sync(m.replica_tensors[0], m.replica_mean ? ReduceOp::kSum : op, m.local_replicas);
    for (std::size_t j = 0; j < m.replica_tensors.size(); ++j) {
      m.replica_ready[j].assign(gradients.size(), 0);
      m.replica_waiting[j].resize(m.buckets.size());
      for (std::size_t b = 0; b < m.buckets.size(); ++b)
        m.replica_waiting[j][b] = m.buckets[b].last - m.buckets[b].first;
    }
    m.replica_sync = true;
  });
}

void MultiWorkerMirroredStrategy::replica_gradient_ready(const ReplicaContext& ctx,
                                                         std::size_t index) {
  if (!impl_->replicas) {
    gradient_ready(index);
    return;
  }
  Impl& m = *impl_;
  const auto r = static_cast<std::size_t>(ctx.local_replica_id);
  std::size_t bucket = 0;
  {
    std::lock_guard<std::mutex> lock(m.replica_mu);
    if (!m.replica_sync) {
      throw InvalidUsage("ReplicaContext::gradient_ready called by local replica " +
                         std::to_string(r) + " without begin_gradient_sync");
    }
    if (index >= m.replica_tensors[r].size()) {
      throw InvalidUsage("ReplicaContext::gradient_ready(" + std::to_string(index) +
                         "): local replica " + std::to_string(r) + "'s step has " +
                         std::to_string(m.replica_tensors[r].size()) + " gradient tensors");
    }
    if (m.replica_ready[r][index]) return;
    m.replica_ready[r][index] = 1;
    bucket = m.bucket_of[index];
    if (--m.replica_waiting[r][bucket] > 0) return;
    if (--m.buckets[bucket].replicas_left > 0) return;
  }
  // This replica completed the bucket on the last of the K: every replica's tensors of it are
  // final and no other thread touches them (the plan and lists are fixed during the step).
  const SyncBucket& b = m.buckets[bucket];
  const std::vector<TensorRef>& dst = m.replica_tensors[0];
  for (std::size_t t = b.first; t < b.last; ++t) {
    for (std::size_t j = 1; j < m.replica_tensors.size(); ++j) {
      kernels::reduce(dst[t].data, m.replica_tensors[j][t].data, dst[t].count, dst[t].dtype,
                      m.sync_op);
    }
  }
  std::lock_guard<std::mutex> lock(m.replica_mu);
  m.buckets[bucket].reduced = true;
  m.launch_ready_buckets();
}

void MultiWorkerMirroredStrategy::replica_finish_sync(const ReplicaContext& ctx) {
  if (!impl_->replicas) {
    finish_gradient_sync();
    return;
  }
  Impl& m = *impl_;
  const auto r = static_cast<std::size_t>(ctx.local_replica_id);
  const auto start = std::chrono::steady_clock::now();
  std::size_t count = 0;
  {
    std::lock_guard<std::mutex> lock(m.replica_mu);
    if (!m.replica_sync) {
      throw InvalidUsage("ReplicaContext::finish_gradient_sync called by local replica " +
                         std::to_string(r) + " without begin_gradient_sync");
    }
    count = m.replica_tensors[r].size();
  }
  for (std::size_t i = 0; i < count; ++i) replica_gradient_ready(ctx, i);
  const int replicas = num_replicas_in_sync();
  // Replica 0, once every replica has marked everything ready (so every bucket has started).
  const auto wait_buckets = [&](const std::vector<TensorRef>&) {
    std::exception_ptr error;
    for (SyncBucket& b : m.buckets) {
      std::shared_ptr<Work> work;
      {
        std::lock_guard<std::mutex> lock(m.replica_mu);
        work = b.work;
      }
      if (!work) continue;
      try {
        work->wait();
      } catch (...) {
        if (!error) error = std::current_exception();
        continue;
      }
      if (!b.in_place && !error)
        unpack_tensors(m.sync_tensors, b.first, b.last, b.wire, b.pack.data());
    }
    const auto end = std::chrono::steady_clock::now();
    // Replica 0's whole finish is exposed (waiting for its siblings included, as in
    // ReplicaContext::all_reduce); the communication spans from the first bucket's start.
    const auto from = m.launched_any ? std::min(m.first_launch, start) : start;
    m.allreduce_seconds += std::chrono::duration<double>(end - from).count();
    m.exposed_seconds += std::chrono::duration<double>(end - start).count();
    for (const TensorRef& g : m.sync_tensors) m.allreduce_bytes += g.count * dtype_size(g.dtype);
    {
      std::lock_guard<std::mutex> lock(m.replica_mu);
      for (SyncBucket& b : m.buckets) b.work.reset();
      m.replica_sync = false;
    }
    if (error) std::rethrow_exception(error);
    if (m.replica_mean) {
      for (const TensorRef& t : m.sync_tensors)
        kernels::scale_divide(t.data, t.count, t.dtype, replicas);
    }
  };
  m.replicas->share(ctx.local_replica_id, m.replica_tensors[r],
                    "ReplicaContext::finish_gradient_sync", wait_buckets);
}

void MultiWorkerMirroredStrategy::drain_replica_sync() noexcept {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.replica_mu);  // every replica thread has returned
  if (!m.replica_sync) return;
  for (SyncBucket& b : m.buckets) {
    if (!b.work) continue;
    try {
      b.work->wait();  // under the communicator's deadline
    } catch (const std::exception& e) {
      MWMS_LOG_WARN(kStrat,
                    "a bucket of the failed overlapped replica step failed too: " << e.what());
    }
    b.work.reset();
  }
  m.replica_sync = false;
}

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
  for (const TensorRef& g : tensors) m.allreduce_bytes += g.count * dtype_size(g.dtype);
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  m.allreduce_seconds += took;
  m.exposed_seconds += took;
}

void ReplicaContext::all_reduce(ReduceOp op, const std::vector<TensorRef>& tensors,
                                DeviceStream stream) const {
  if (strategy_ == nullptr) {
    throw InvalidUsage(
        "ReplicaContext::all_reduce: this context was not passed by "
        "MultiWorkerMirroredStrategy::run()");
  }
  strategy_->replica_device_collective(*this, op, tensors, stream, false);
}

void ReplicaContext::broadcast_variables(const std::vector<TensorRef>& variables,
                                         DeviceStream stream) const {
  if (strategy_ == nullptr) {
    throw InvalidUsage(
        "ReplicaContext::broadcast_variables: this context was not passed by "
        "MultiWorkerMirroredStrategy::run()");
  }
  strategy_->replica_device_collective(*this, ReduceOp::kSum, variables, stream, true);
}

void ReplicaContext::begin_gradient_sync(const std::vector<TensorRef>& gradients,
                                         ReduceOp op) const {
  if (strategy_ == nullptr) {
    throw InvalidUsage(
        "ReplicaContext::begin_gradient_sync: this context was not passed by "
        "MultiWorkerMirroredStrategy::run()");
  }
  strategy_->replica_begin_sync(*this, gradients, op);
}

void ReplicaContext::gradient_ready(std::size_t index) const {
  if (strategy_ == nullptr) {
    throw InvalidUsage(
        "ReplicaContext::gradient_ready: this context was not passed by "
        "MultiWorkerMirroredStrategy::run()");
  }
  strategy_->replica_gradient_ready(*this, index);
}

void ReplicaContext::finish_gradient_sync() const {
  if (strategy_ == nullptr) {
    throw InvalidUsage(
        "ReplicaContext::finish_gradient_sync: this context was not passed by "
        "MultiWorkerMirroredStrategy::run()");
  }
  strategy_->replica_finish_sync(*this);
}

void ReplicaContext::all_reduce(ReduceOp op, const std::vector<TensorRef>& tensors) const {
  if (strategy_ == nullptr) {
    throw InvalidUsage(
        "ReplicaContext::all_reduce: this context was not passed by "
        "MultiWorkerMirroredStrategy::run()");
  }
  strategy_->replica_all_reduce(*this, op, tensors);
}

void ReplicaContext::broadcast_variables(const std::vector<TensorRef>& variables) const {
  if (strategy_ == nullptr) {
    throw InvalidUsage(
        "ReplicaContext::broadcast_variables: this context was not passed by "
        "MultiWorkerMirroredStrategy::run()");
  }
  strategy_->replica_broadcast(*this, variables);
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
  for (const TensorRef& g : gradients) impl_->allreduce_bytes += g.count * dtype_size(g.dtype);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  impl_->allreduce_seconds += took;
  impl_->exposed_seconds += took;  // blocking: nothing hides it
}

// Note [overlapped buckets]: buckets start strictly in list order, each once all its tensors
// are ready, so every worker issues the same all-reduces in the same order (the communicator
// runs them in call order on its progress thread) even when backprop marks tensors ready in
// another order; a bucket whose tensors are ready waits for the earlier buckets. Each bucket has
// its own pack buffer, since several are in flight at once.
namespace {

bool same_tensors(const std::vector<TensorRef>& a, const std::vector<TensorRef>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].data != b[i].data || a[i].count != b[i].count || a[i].dtype != b[i].dtype) {
      return false;
    }
  }
  return true;
}

// Builds the bucket plan of `gradients` into m (kept when the list is the one of the previous
// step: nothing allocated once the pack buffers have grown) and resets the per-step state.
}  // namespace

void MultiWorkerMirroredStrategy::Impl::plan_sync(const std::vector<TensorRef>& gradients,
                                                  ReduceOp op, int replicas_per_bucket) {
  Impl& m = *this;
  if (!same_tensors(gradients, m.sync_tensors) || m.buckets.empty() != gradients.empty()) {
    m.sync_tensors = gradients;
    m.buckets.clear();
    m.bucket_of.assign(gradients.size(), 0);
    for_each_bucket(gradients, m.options.bytes_per_pack, solo_bytes(m.options),
                    [&](std::size_t first, std::size_t last, std::size_t bytes) {
      SyncBucket b;
      b.first = first;
      b.last = last;
      b.bytes = bytes;
      const DataType dtype = gradients[first].dtype;
      b.wire = wire_type(m.options.compression, dtype);
      b.in_place = b.wire == dtype && contiguous_tensors(gradients, first, last);
      if (!b.in_place) b.pack.resize(bytes / dtype_size(dtype) * dtype_size(b.wire));
      for (std::size_t i = first; i < last; ++i) m.bucket_of[i] = m.buckets.size();
      m.buckets.push_back(std::move(b));
    });
  }
  for (SyncBucket& b : m.buckets) {
    b.waiting = b.last - b.first;
    b.replicas_left = replicas_per_bucket;
    b.reduced = false;
    b.work.reset();
  }
  m.ready.assign(gradients.size(), false);
  m.sync_op = op;
  m.next_launch = 0;
  m.launched_any = false;
}

// Starts, in list order, every bucket that is ready and whose predecessors have started (Note
// [overlapped buckets]). K > 1: called under replica_mu, by whichever replica thread reduced a
// bucket, so the communicator sees one thread at a time.
void MultiWorkerMirroredStrategy::Impl::launch_ready_buckets() {
  Impl& m = *this;
  while (m.next_launch < m.buckets.size() && m.buckets[m.next_launch].reduced) {
    SyncBucket& b = m.buckets[m.next_launch++];
    const std::size_t elems = b.bytes / dtype_size(m.sync_tensors[b.first].dtype);
    void* data = m.sync_tensors[b.first].data;
    if (!b.in_place) {
      pack_tensors(m.sync_tensors, b.first, b.last, b.wire, b.pack.data());
      data = b.pack.data();
    }
    if (!m.launched_any) {
      m.first_launch = std::chrono::steady_clock::now();
      m.launched_any = true;
    }
    b.work = m.comm->all_reduce_async(data, elems, b.wire, m.sync_op);
  }
}

void MultiWorkerMirroredStrategy::begin_gradient_sync(const std::vector<TensorRef>& gradients,
                                                      ReduceOp op) {
  Impl& m = *impl_;
  if (m.sync_active) {
    throw InvalidUsage("begin_gradient_sync called again before finish_gradient_sync");
  }
  check_tensors(gradients, "begin_gradient_sync");
  {
    std::lock_guard<std::mutex> lock(m.replica_mu);
    if (m.replica_sync) {
      throw InvalidUsage("begin_gradient_sync called during a ReplicaContext overlapped step");
    }
  }
  m.plan_sync(gradients, op, 1);
  m.sync_active = true;
}

void MultiWorkerMirroredStrategy::gradient_ready(std::size_t index) {
  Impl& m = *impl_;
  if (!m.sync_active) throw InvalidUsage("gradient_ready called without begin_gradient_sync");
  if (index >= m.sync_tensors.size()) {
    throw InvalidUsage("gradient_ready(" + std::to_string(index) + "): the step has " +
                       std::to_string(m.sync_tensors.size()) + " gradient tensors");
  }
  if (m.ready[index]) return;
  m.ready[index] = true;
  SyncBucket& b = m.buckets[m.bucket_of[index]];
  if (--b.waiting == 0) b.reduced = true;
  m.launch_ready_buckets();
}

void MultiWorkerMirroredStrategy::finish_gradient_sync() {
  Impl& m = *impl_;
  if (!m.sync_active) throw InvalidUsage("finish_gradient_sync called without begin_gradient_sync");
  std::exception_ptr error;
  try {
    for (std::size_t i = 0; i < m.sync_tensors.size(); ++i) gradient_ready(i);
  } catch (...) {
    error = std::current_exception();
  }
  const auto wait_start = std::chrono::steady_clock::now();
  for (SyncBucket& b : m.buckets) {
    if (!b.work) continue;
    try {
      b.work->wait();
    } catch (...) {
      if (!error) error = std::current_exception();
      continue;
    }
    if (!b.in_place && !error) {
      unpack_tensors(m.sync_tensors, b.first, b.last, b.wire, b.pack.data());
    }
  }
  const auto end = std::chrono::steady_clock::now();
  m.exposed_seconds += std::chrono::duration<double>(end - wait_start).count();
  if (m.launched_any) {
    m.allreduce_seconds += std::chrono::duration<double>(end - m.first_launch).count();
  }
  for (const TensorRef& g : m.sync_tensors) m.allreduce_bytes += g.count * dtype_size(g.dtype);
  for (SyncBucket& b : m.buckets) b.work.reset();
  m.sync_active = false;
  if (error) std::rethrow_exception(error);
}

double MultiWorkerMirroredStrategy::exposed_allreduce_seconds() const noexcept {
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
  impl_->comm->finalize();
}

double MultiWorkerMirroredStrategy::allreduce_seconds() const noexcept {
  return impl_->allreduce_seconds;
}
std::size_t MultiWorkerMirroredStrategy::allreduce_bytes() const noexcept {
  return impl_->allreduce_bytes;
}

}  // namespace mwms
