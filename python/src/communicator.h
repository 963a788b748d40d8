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
  /// Rendezvous and links (Communicator::create), on a Job: interruptible.
  PyCommunicator(const ResolvedCluster& cluster, const CommunicatorOptions& options);
  /// Destroys the communicator with the GIL released (it waits for outstanding asynchronous
  /// collectives, each under its deadline), then drops their buffers.
  ~PyCommunicator();

  Communicator& comm() { return *comm_; }
  /// Keeps `buffers` alive until `work` (already started) has completed; returns `work`.
  std::shared_ptr<Work> track(std::shared_ptr<Work> work, std::vector<Buffer> buffers);
  /// Waits for `work` (started by `op`) with the GIL released, interruptibly; rethrows its error.
  void wait(Work& work, const char* op, std::optional<double> timeout_seconds = std::nullopt);
  /// Orderly shutdown (Communicator::finalize), interruptibly.
  void finalize();
  /// Drops the buffers of collectives that have completed. Under the GIL.
  void prune();

 private:
  std::unique_ptr<Communicator> comm_;
  std::vector<PendingWork> pending_;
};

}  // namespace mwms::python
