// mwms.MultiWorkerMirroredStrategy's C++ side, shared by strategy.cc (the strategy) and
// replica_context.cc (run() and ReplicaContext, Note [python replicas]).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bindings.h"
#include "buffers.h"
#include "interrupt.h"
#include "mwms/errors.h"
#include "mwms/strategy.h"

namespace mwms::python {

/// Owns the C++ strategy; its blocking calls run with the GIL released and Ctrl-C aborts the
/// strategy's communicator (Note [python interrupts]). One Python object per strategy.
class PyStrategy {
 public:
  /// Builds the strategy on a Job (the rendezvous has nothing to abort yet). Blocks as the C++
  /// constructor does; Ctrl-C raises KeyboardInterrupt within kSliceSeconds.
  PyStrategy(const ResolvedCluster& cluster, const CommunicationOptions& options,
             const ReplicaOptions& replicas);
  /// Destroys the strategy with the GIL released (its replica threads are joined).
  ~PyStrategy();
  PyStrategy(const PyStrategy&) = delete;
  PyStrategy& operator=(const PyStrategy&) = delete;

  MultiWorkerMirroredStrategy& get() { return *strategy_; }

  /// Runs a blocking call on the calling thread, interruptibly (Note [python interrupts]).
  /// @throws InvalidUsage inside run() with K > 1 (the replicas use their ReplicaContext; the
  /// strategy's collectives are per worker, for the calling thread outside run()).
  void run(const char* op, const std::function<void()>& call) {
    if (in_run && strategy_->num_local_replicas() > 1) {
      throw InvalidUsage(std::string("MultiWorkerMirroredStrategy.") + op +
                         " inside run() with local replicas: each replica uses "
                         "mwms.get_replica_context()'s collectives instead");
    }
    run_interruptibly(strategy_->communicator(), op, call);
  }

  /// broadcast_variables (gradients false) or all_reduce_gradients of a sequence of arrays,
  /// naming each element in errors ("gradients[1]"). Under the GIL.
  void collective_on_tensors(const char* op, nb::handle tensors, bool gradients, ReduceOp rop);

  /// The arrays of the overlapped step in progress (begin_gradient_sync to finish), held so
  /// that their memory outlives the buckets; destroyed after the strategy, under the GIL.
  std::vector<Buffer> sync_buffers;
  /// True while run() calls the replica functions (set and read under the GIL).
  bool in_run = false;

 private:
  std::unique_ptr<MultiWorkerMirroredStrategy> strategy_;
};

/// Binds ReplicaContext, get_replica_context() and the strategy's run(),
/// experimental_local_results() and reduce() (replica_context.cc).
void bind_replicas(nb::module_& m, nb::class_<PyStrategy>& strategy);

}  // namespace mwms::python
