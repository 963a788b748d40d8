// The overlapped step of K > 1 local replicas (ReplicaContext::begin_gradient_sync /
// gradient_ready / finish_gradient_sync; Note [overlapped replica buckets]), its cleanup after a
// failed run() (drain_replica_sync) and the check that no such step is active
// (check_no_replica_sync). K = 1 forwards to the strategy's own step (overlap.cc).
#include <algorithm>
#include <chrono>
#include <exception>
#include <mutex>
#include <string>

#include "common/logging.h"
#include "kernels/reduce.h"
#include "mwms/errors.h"
#include "mwms/strategy.h"
#include "strategy/buckets.h"
#include "strategy/strategy_impl.h"

namespace mwms {

using strategy::check_tensors;

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
    m.wait_started_buckets(error);
    const auto end = std::chrono::steady_clock::now();
    // Replica 0's whole finish is exposed (waiting for its siblings included, as in
    // ReplicaContext::all_reduce); the communication spans from the first bucket's start.
    const auto from = m.launched_any ? std::min(m.first_launch, start) : start;
    m.all_reduce_seconds += std::chrono::duration<double>(end - from).count();
    m.exposed_seconds += std::chrono::duration<double>(end - start).count();
    for (const TensorRef& g : m.sync_tensors) m.all_reduce_bytes += g.count * dtype_size(g.dtype);
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

void ReplicaContext::begin_gradient_sync(const std::vector<TensorRef>& gradients,
                                         ReduceOp op) const {
  strategy::bound_strategy(strategy_, "ReplicaContext::begin_gradient_sync")
      .replica_begin_sync(*this, gradients, op);
}

void ReplicaContext::gradient_ready(std::size_t index) const {
  strategy::bound_strategy(strategy_, "ReplicaContext::gradient_ready")
      .replica_gradient_ready(*this, index);
}

void ReplicaContext::finish_gradient_sync() const {
  strategy::bound_strategy(strategy_, "ReplicaContext::finish_gradient_sync")
      .replica_finish_sync(*this);
}

}  // namespace mwms
