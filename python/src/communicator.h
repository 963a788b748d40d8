// The Python Communicator's C++ side, shared with strategy.cc (which reuses its option parsing).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "buffers.h"
#include "interrupt.h"
#include "mwms/cluster.h"
#include "mwms/communicator.h"

namespace mwms::python {

/// An asynchronous collective still outstanding and the buffers it reads and writes, which stay
/// alive until it has completed, whatever the Python program does with its Work or its arrays.
struct PendingWork {
  std::shared_ptr<Work> work;
  std::vector<Buffer> buffers;
};

/// Owns the C++ Communicator behind mwms.Communicator (Note [python interrupts]).
class PyCommunicator {
 public:
  /// Rendezvous and links (Communicator::create), interruptibly.
  /// With `interruptible`, blocking collectives run on the progress thread (waited for
  /// interruptibly); without, on the calling thread.
  PyCommunicator(const ResolvedCluster& cluster, const CommunicatorOptions& options,
                 bool interruptible);
  /// Destroys the communicator with the GIL released; leaks it (and the buffers it may still
  /// write) when an interrupted collective is still running, rather than wait for its deadline.
  ~PyCommunicator();

  Communicator& comm() { return *comm_; }
  bool interruptible() const { return interruptible_; }
  /// Queues `work` (already started) with its buffers and returns it.
  std::shared_ptr<Work> track(std::shared_ptr<Work> work, std::vector<Buffer> buffers);
  /// Waits interruptibly for `work` (started by `op`); rethrows its error.
  void wait(Work& work, const char* op);
  /// Aborts after a KeyboardInterrupt in `op` (or any signal handler's exception).
  void interrupted(const char* op);
  /// Orderly shutdown (Communicator::finalize), interruptibly.
  void finalize();
  /// Drops the buffers of collectives that have completed. Under the GIL.
  void prune();

 private:
  std::unique_ptr<Communicator> comm_;
  std::vector<PendingWork> pending_;
  std::shared_ptr<Job> stuck_job_;  // a finalize() interrupted while it ran
  bool interrupted_ = false;
  bool interruptible_ = true;
};

/// The ReduceOp of `op` (a ReduceOp or its name).
ReduceOp to_reduce_op(const ReduceOpArg& op);

}  // namespace mwms::python
