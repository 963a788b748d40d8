// Local replicas on the CPU: the replica threads, their barrier and the local halves of the
// replica collectives.
//
// Note [local replicas]: a collective of K local replicas runs in phases separated by a barrier
// of the K threads:
//   1. gather: each replica registers its tensor list; the last to arrive checks that every list
//      has replica 0's shapes (a mismatch fails all K at once, naming the replica and tensor);
//   2. local step (all_reduce only): replica j combines slice j of every tensor (elements
//      [count*j/K, count*(j+1)/K)) of replicas 1..K-1 into replica 0's tensor, in replica order,
//      so the result does not depend on thread timing and the K threads share the work;
//   3. across: replica 0 alone runs the cross-worker step on its tensors (the strategy's bucketed
//      all-reduce or broadcast through the communicator: only one thread ever touches it);
//   4. copy: replicas 1..K-1 copy replica 0's tensors into their own;
//   5. a last barrier, so that replica 0 does not overwrite its tensors (the next step's
//      gradients) while another replica still copies them.
// Every barrier wait has the strategy's deadline, re-armed while replica 0 is in phase 3 (that
// step has the communicator's own deadlines: its slowness is not a local replica's fault). A
// failure anywhere (a body's exception, a collective's error, a timeout, a replica that returned
// from its body while others wait for it) is recorded once, as the root, and wakes every waiter,
// which throws ReplicaError naming the failed replica; run() rethrows the root after every body
// has returned, so nothing hangs and the caller sees the original error. Two shorter forms reuse
// the phases: share() is phases 1, 3, 4, 5 under another name (the end of an overlapped step,
// Note [overlapped replica buckets]), step() is phase 1, then replica 0's leader() alone (the
// others' deadline re-armed, as in phase 3), then a barrier (the start of an overlapped step;
// the GPU replicas' NCCL group, Note [gpu replicas]): no copies.
#include "strategy/local_replicas.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <sstream>
#include <system_error>
#include <utility>

#include "common/exception_text.h"
#include "kernels/reduce.h"

namespace mwms::strategy {
namespace {

using Clock = std::chrono::steady_clock;


Clock::time_point deadline_after(double seconds) {
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

}  // namespace

LocalReplicas::LocalReplicas(int k, double timeout_seconds, int worker, ErrorContext context)
    : k_(k),
      timeout_seconds_(timeout_seconds),
      worker_(worker),
      context_(std::move(context)),
      here_(static_cast<std::size_t>(k), 0),
      returned_(static_cast<std::size_t>(k), 0),
      tensors_(static_cast<std::size_t>(k), nullptr) {
  threads_.reserve(static_cast<std::size_t>(k - 1));
  try {
    for (int i = 1; i < k; ++i) threads_.emplace_back([this, i] { thread_main(i); });
  } catch (const std::system_error& e) {
    stop_threads();
    throw BackendError("cannot start the thread of local replica " +
                           std::to_string(threads_.size() + 1) + " of " + std::to_string(k) + ": " +
                           e.what(),
                       e.code().value(), context_);
  }
}

LocalReplicas::~LocalReplicas() { stop_threads(); }

void LocalReplicas::stop_threads() noexcept {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  job_cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

std::string LocalReplicas::replica_name(int local_id) const {
  return "local replica " + std::to_string(local_id) + " (replica_id_in_sync_group " +
         std::to_string(worker_ * k_ + local_id) + ") of worker " + std::to_string(worker_);
}

void LocalReplicas::thread_main(int local_id) {
  std::uint64_t seen = 0;
  for (;;) {
    {
      // Idle between run() calls: no deadline, this is not a wait of any call.
      std::unique_lock<std::mutex> lock(mu_);
      job_cv_.wait(lock, [&] { return stop_ || job_ != seen; });
      if (stop_) return;
      seen = job_;
    }
    run_body(local_id);
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++finished_;
    }
    sync_cv_.notify_all();
  }
}

void LocalReplicas::run_body(int local_id) {
  try {
    (*body_)(local_id);
  } catch (...) {
    std::exception_ptr error = std::current_exception();
    std::lock_guard<std::mutex> lock(mu_);
    fail_locked(local_id, error, common::exception_text(error));
  }
  std::lock_guard<std::mutex> lock(mu_);
  returned_[static_cast<std::size_t>(local_id)] = 1;
  if (arrived_ > 0 && !failure_) {
    // Replicas wait in a collective this one will never join.
    std::string waiting;
    for (int j = 0; j < k_; ++j) {
      if (here_[static_cast<std::size_t>(j)])
        waiting += (waiting.empty() ? "" : ", ") + std::to_string(j);
    }
    const std::string what =
        replica_name(local_id) + " returned from its function while local replica(s) " + waiting +
        " wait for it in ReplicaContext collective #" + std::to_string(collectives_) +
        ": every local replica must make the same ReplicaContext calls";
    fail_locked(local_id, std::make_exception_ptr(InvalidUsage(what, context_)), what);
  }
  sync_cv_.notify_all();
}

void LocalReplicas::run(const std::function<void(int)>& body) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (running_) {
      throw InvalidUsage("MultiWorkerMirroredStrategy::run called from inside run()", context_);
    }
    running_ = true;
    body_ = &body;
    finished_ = 0;
    arrived_ = 0;
    collectives_ = 0;
    leader_busy_ = false;
    std::fill(here_.begin(), here_.end(), 0);
    std::fill(returned_.begin(), returned_.end(), 0);
    failure_ = nullptr;
    failed_replica_ = -1;
    failure_what_.clear();
    ++job_;
  }
  job_cv_.notify_all();
  run_body(0);
  std::exception_ptr failure;
  {
    // Waits for user code on the other threads (their collectives have deadlines; their own
    // computation has none, as a single-threaded fn has none).
    std::unique_lock<std::mutex> lock(mu_);
    sync_cv_.wait(lock, [&] { return finished_ == k_ - 1; });
    running_ = false;
    body_ = nullptr;
    failure = std::move(failure_);  // not kept until the next run (it may hold much)
    failure_ = nullptr;
  }
  if (failure) std::rethrow_exception(failure);
}

void LocalReplicas::fail_locked(int local_id, std::exception_ptr error, const std::string& what) {
  if (failure_) return;  // the first failure is the root; later ones are its consequences
  failure_ = std::move(error);
  failed_replica_ = local_id;
  failure_what_ = what;
  sync_cv_.notify_all();
}

void LocalReplicas::throw_replica_error_locked(int local_id, const char* op) {
  ErrorContext ctx = context_;
  ctx.op = op;
  throw ReplicaError(replica_name(failed_replica_) + " failed: " + failure_what_ +
                         "; local replica " + std::to_string(local_id) + " stopped waiting in " +
                         op + " #" + std::to_string(collectives_),
                     ctx);
}

void LocalReplicas::check_shapes_locked(const char* op) {
  const std::vector<TensorRef>& first = *tensors_[0];
  for (int j = 1; j < k_; ++j) {
    const std::vector<TensorRef>& other = *tensors_[static_cast<std::size_t>(j)];
    std::ostringstream what;
    if (other.size() != first.size()) {
      what << op << ": " << replica_name(j) << " passed " << other.size()
           << " tensor(s), local replica 0 passed " << first.size();
    } else {
      for (std::size_t t = 0; t < first.size(); ++t) {
        if (other[t].count == first[t].count && other[t].dtype == first[t].dtype) continue;
        what << op << ": tensor " << t << " of " << replica_name(j) << " has count "
             << other[t].count << " " << to_string(other[t].dtype)
             << ", local replica 0's has count " << first[t].count << " "
             << to_string(first[t].dtype);
        break;
      }
    }
    if (!what.str().empty()) {
      ErrorContext ctx = context_;
      ctx.op = op;
      fail_locked(j, std::make_exception_ptr(InvalidArgument(what.str(), ctx)), what.str());
      return;
    }
  }
}

void LocalReplicas::gather(int local_id, const std::vector<TensorRef>* tensors, const char* op) {
  std::unique_lock<std::mutex> lock(mu_);
  if (tensors != nullptr) {
    tensors_[static_cast<std::size_t>(local_id)] = tensors;
    // Phase 4 reads replica 0's list from this copy (capacity reused: no allocation once grown),
    // which outlives the call: replica 0 may unwind its own list on a failure while another
    // replica still copies.
    if (local_id == 0) leader_tensors_.assign(tensors->begin(), tensors->end());
  }
  if (failure_) throw_replica_error_locked(local_id, op);
  for (int j = 0; j < k_; ++j) {
    if (!returned_[static_cast<std::size_t>(j)]) continue;
    const std::string what = replica_name(j) + " returned from its function; " +
                             replica_name(local_id) + " called " + op + " #" +
                             std::to_string(collectives_) +
                             ", which it will never join: every local replica must make the "
                             "same ReplicaContext calls";
    fail_locked(local_id, std::make_exception_ptr(InvalidUsage(what, context_)), what);
    throw InvalidUsage(what, context_);
  }
  here_[static_cast<std::size_t>(local_id)] = 1;
  const std::uint64_t generation = generation_;
  if (++arrived_ == k_) {
    if (tensors != nullptr) {
      check_shapes_locked(op);
      ++collectives_;
    }
    arrived_ = 0;
    std::fill(here_.begin(), here_.end(), 0);
    ++generation_;
    sync_cv_.notify_all();
    if (failure_) throw_replica_error_locked(local_id, op);
    return;
  }
  Clock::time_point deadline = deadline_after(timeout_seconds_);
  while (generation_ == generation) {
    if (failure_) {
      here_[static_cast<std::size_t>(local_id)] = 0;
      --arrived_;
      throw_replica_error_locked(local_id, op);
    }
    if (sync_cv_.wait_until(lock, deadline) != std::cv_status::timeout) continue;
    if (generation_ != generation || failure_) continue;
    if (leader_busy_) {
      deadline = deadline_after(timeout_seconds_);
      continue;
    }
    std::string missing;
    for (int j = 0; j < k_; ++j) {
      if (!here_[static_cast<std::size_t>(j)])
        missing += (missing.empty() ? "" : ", ") + std::to_string(j);
    }
    ErrorContext ctx = context_;
    ctx.op = op;
    ctx.timeout_seconds = timeout_seconds_;
    const std::string what = "local replica(s) " + missing + " of worker " +
                             std::to_string(worker_) + " did not reach " + op + " #" +
                             std::to_string(collectives_) + " within " +
                             std::to_string(timeout_seconds_) + " s (local replica " +
                             std::to_string(local_id) + " waited)";
    TimeoutError error(what, ctx);
    fail_locked(local_id, std::make_exception_ptr(error), what);
    here_[static_cast<std::size_t>(local_id)] = 0;
    --arrived_;
    throw error;
  }
  if (failure_ && tensors != nullptr) throw_replica_error_locked(local_id, op);
}

void LocalReplicas::barrier(int local_id, const char* op) { gather(local_id, nullptr, op); }

void LocalReplicas::collective(int local_id, const std::vector<TensorRef>& tensors, const char* op,
                               const std::function<void(int)>& local_step,
                               const std::function<void(const std::vector<TensorRef>&)>& across) {
  gather(local_id, &tensors, op);
  if (local_step) {
    local_step(local_id);
    barrier(local_id, op);
  }
  if (local_id == 0) {
    lead([&] {
      if (across) across(tensors);
    });
  }
  barrier(local_id, op);
  if (local_id != 0) {
    // Phase 1 checked the shapes; replica 0's tensors hold the result until the last barrier.
    const std::vector<TensorRef>& result = leader_tensors_;
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      if (tensors[t].count > 0 && tensors[t].data != result[t].data) {
        std::memcpy(tensors[t].data, result[t].data,
                    tensors[t].count * dtype_size(tensors[t].dtype));
      }
    }
  }
  barrier(local_id, op);
}

void LocalReplicas::all_reduce(int local_id, const std::vector<TensorRef>& tensors, ReduceOp op,
                               const std::function<void(const std::vector<TensorRef>&)>& across) {
  const std::function<void(int)> reduce_slice = [&](int j) {
    // Note [local replicas], phase 2: slice j of every tensor, replicas combined in order.
    const std::vector<TensorRef>& dst = *tensors_[0];
    for (std::size_t t = 0; t < dst.size(); ++t) {
      const std::size_t count = dst[t].count;
      const std::size_t lo = count * static_cast<std::size_t>(j) / static_cast<std::size_t>(k_);
      const std::size_t hi = count * static_cast<std::size_t>(j + 1) / static_cast<std::size_t>(k_);
      if (hi == lo) continue;
      const std::size_t size = dtype_size(dst[t].dtype);
      char* out = static_cast<char*>(dst[t].data) + lo * size;
      for (int r = 1; r < k_; ++r) {
        const char* in = static_cast<const char*>((*tensors_[static_cast<std::size_t>(r)])[t].data);
        kernels::reduce(out, in + lo * size, hi - lo, dst[t].dtype, op);
      }
    }
  };
  collective(local_id, tensors, "ReplicaContext::all_reduce", reduce_slice, across);
}

void LocalReplicas::broadcast(int local_id, const std::vector<TensorRef>& tensors,
                              const std::function<void(const std::vector<TensorRef>&)>& across) {
  collective(local_id, tensors, "ReplicaContext::broadcast_variables", {}, across);
}

void LocalReplicas::share(int local_id, const std::vector<TensorRef>& tensors, const char* op,
                          const std::function<void(const std::vector<TensorRef>&)>& across) {
  collective(local_id, tensors, op, {}, across);
}

void LocalReplicas::step(int local_id, const std::vector<TensorRef>& tensors, const char* op,
                         const std::function<void()>& leader) {
  gather(local_id, &tensors, op);
  // leader() may wait on the devices or the network under its own deadlines (a GPU replicas'
  // NCCL group): the others re-arm theirs meanwhile, as in phase 3 of a collective.
  if (local_id == 0) lead(leader);
  barrier(local_id, op);
}

void LocalReplicas::lead(const std::function<void()>& fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    leader_busy_ = true;
  }
  try {
    fn();
  } catch (...) {
    std::exception_ptr error = std::current_exception();
    std::lock_guard<std::mutex> lock(mu_);
    leader_busy_ = false;
    fail_locked(0, error, common::exception_text(error));
    throw;
  }
  std::lock_guard<std::mutex> lock(mu_);
  leader_busy_ = false;
}

}  // namespace mwms::strategy
