// K local replicas of one worker on the CPU: K - 1 persistent threads plus the caller, a barrier
// among them with deadlines and failure propagation, and the local halves of the replica
// collectives (reduce into replica 0's tensors by slices, copy back). Note [local replicas].
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "mwms/errors.h"
#include "mwms/strategy.h"
#include "mwms/types.h"

namespace mwms::strategy {

/// The replica threads of one worker and their local collectives. Built by the strategy when
/// K > 1; run() is called from one thread at a time (the strategy's), the collectives from the
/// K replica threads inside it.
class LocalReplicas {
 public:
  /// Starts k - 1 threads (k >= 2). `timeout_seconds` (> 0) bounds every local wait; `worker`
  /// and `context` name this worker in errors.
  LocalReplicas(int k, double timeout_seconds, int worker, ErrorContext context);
  /// Stops and joins the threads. Never throws. Must not be called while run() is active.
  ~LocalReplicas();
  LocalReplicas(const LocalReplicas&) = delete;
  LocalReplicas& operator=(const LocalReplicas&) = delete;

  /// K.
  int size() const noexcept { return k_; }

  /// Runs body(local_id) for every local_id in [0, K) at once (0 on the calling thread) and
  /// returns when all have returned; then rethrows the first root failure (a body's own exception
  /// or a collective's error, never the ReplicaError the others got). Blocks without a deadline
  /// on the bodies themselves (user code), every wait inside the collectives has one.
  /// @throws InvalidUsage when called again from inside a body.
  void run(const std::function<void(int)>& body);

  /// Collective among the K replicas (each calls it from its body with its own tensors):
  /// combines every replica's tensors with `op` into replica 0's, in replica order (element i is
  /// ((t0 op t1) op t2) ...: the same bits whatever the thread timing), each replica thread
  /// reducing one slice; then replica 0 runs across(replica 0's tensors) alone (the cross-worker
  /// step, may be empty); then every other replica copies replica 0's tensors into its own.
  /// Returns when all of that is done on every replica. @throws InvalidArgument (null data, or
  /// shapes differing from replica 0's), InvalidUsage (a replica returned without this call),
  /// TimeoutError (a replica missed the deadline), ReplicaError (another replica failed), and
  /// whatever across() throws (on replica 0).
  void all_reduce(int local_id, const std::vector<TensorRef>& tensors, ReduceOp op,
                  const std::function<void(const std::vector<TensorRef>&)>& across);

  /// As all_reduce without the local reduction: replica 0 runs across(its tensors) (the
  /// cross-worker broadcast), then every replica copies replica 0's values into its own.
  void broadcast(int local_id, const std::vector<TensorRef>& tensors,
                 const std::function<void(const std::vector<TensorRef>&)>& across);

  /// As broadcast, with `op` naming the collective in errors (the end of an overlapped replica
  /// step: across() waits for the buckets, then every replica copies replica 0's result).
  void share(int local_id, const std::vector<TensorRef>& tensors, const char* op,
             const std::function<void(const std::vector<TensorRef>&)>& across);

  /// Collective among the K replicas without copies: every replica registers `tensors` (shapes
  /// checked against replica 0's), replica 0 alone runs leader(), then all return together (the
  /// start of an overlapped replica step: replica 0 sets up the shared bucket plan before any
  /// replica marks a gradient ready; a GPU replicas' NCCL group). While leader() runs, the
  /// others' deadline is re-armed. Blocks and throws as all_reduce (whatever leader() throws, on
  /// replica 0).
  void step(int local_id, const std::vector<TensorRef>& tensors, const char* op,
            const std::function<void()>& leader);

 private:
  // Tells the replica threads to stop and joins every started one (they are idle between runs).
  void stop_threads() noexcept;
  void thread_main(int local_id);
  void run_body(int local_id);
  // Registers `tensors` for local_id and waits until every replica has (phase 0 of a
  // collective); the last to arrive checks the shapes against replica 0's.
  void gather(int local_id, const std::vector<TensorRef>* tensors, const char* op);
  // Waits until all K replicas reach this point of the current collective.
  void barrier(int local_id, const char* op);
  void collective(int local_id, const std::vector<TensorRef>& tensors, const char* op,
                  const std::function<void(int)>& local_step,
                  const std::function<void(const std::vector<TensorRef>&)>& across);
  // Replica 0 runs fn() alone (phase 3 of a collective, or step()'s leader) with leader_busy_
  // set, so the others re-arm their deadline; a failure of fn() is recorded as the root and
  // rethrown.
  void lead(const std::function<void()>& fn);
  // Records the first failure (under mu_) and wakes every waiter.
  void fail_locked(int local_id, std::exception_ptr error, const std::string& what);
  [[noreturn]] void throw_replica_error_locked(int local_id, const char* op);
  std::string replica_name(int local_id) const;
  void check_shapes_locked(const char* op);

  const int k_;
  const double timeout_seconds_;
  const int worker_;
  const ErrorContext context_;

  std::mutex mu_;
  std::condition_variable job_cv_;   // replica threads wait here for a run()
  std::condition_variable sync_cv_;  // barrier and the end of run()
  const std::function<void(int)>* body_ = nullptr;
  std::uint64_t job_ = 0;  // run() generation
  bool stop_ = false;
  bool running_ = false;
  int finished_ = 0;  // replica threads done with the current job
  std::thread::id caller_;

  // Barrier (reset by run()).
  std::uint64_t generation_ = 0;
  int arrived_ = 0;
  std::vector<char> here_;         // per replica: arrived at the current barrier
  std::vector<char> returned_;     // per replica: its body has returned
  std::uint64_t collectives_ = 0;  // completed gathers in this run(), for messages
  bool leader_busy_ = false;       // replica 0 is in across(): waiters re-arm their deadline
  std::vector<const std::vector<TensorRef>*> tensors_;  // per replica, during a collective
  std::vector<TensorRef> leader_tensors_;  // replica 0's list of the current collective

  // Failure of the current run().
  std::exception_ptr failure_;
  int failed_replica_ = -1;
  std::string failure_what_;

  std::vector<std::thread> threads_;
};

}  // namespace mwms::strategy
