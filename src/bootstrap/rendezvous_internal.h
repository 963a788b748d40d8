// What the two sides of the rendezvous share (rendezvous.cc: the follower and the entry point;
// rendezvous_leader.cc: the leader). Private to src/bootstrap.
#pragma once

#include <chrono>
#include <sstream>
#include <string>
#include <vector>

#include "bootstrap/peer_info.h"
#include "common/logging.h"
#include "common/socket.h"
#include "mwms/cluster.h"
#include "mwms/errors.h"

namespace mwms::bootstrap::detail {

/// "3.0 s".
std::string fmt_seconds(double s);

/// The error context of task `c` in the rendezvous, naming `peer` (a rank) when >= 0.
ErrorContext context_of(const ResolvedCluster& c, int peer = -1);

/// Sources whose addresses are exchanged at start-up rather than listed in a spec (mpirun,
/// torchrun): every rank's view of "the cluster" is then empty, and the leader learns the
/// followers' addresses.
bool addresses_exchanged(const ResolvedCluster& c);

/// Logs the wait for a rendezvous at info once (after 1 s), then every 5 s at warn (issue 7):
/// "rendezvous: waiting for worker 1 at host:port (20 s of 60 s)". Not thread-safe.
class WaitLog {
 public:
  explicit WaitLog(double timeout) : timeout_(timeout) {}
  /// Logs what() with the time waited when the next line is due; `what` is called only then.
  template <typename What>
  void tick(const What& what) {
    auto now = common::Clock::now();
    if (now < next_) return;
    double waited = std::chrono::duration<double>(now - start_).count();
    std::ostringstream line;
    line << what() << " (" << static_cast<int>(waited) << " s of " << timeout_ << " s)";
    if (first_) {
      MWMS_LOG_INFO(kBoot, line.str());
    } else {
      MWMS_LOG_WARN(kBoot, line.str());
    }
    first_ = false;
    next_ = now + std::chrono::seconds(5);
  }

 private:
  double timeout_;
  common::Clock::time_point start_ = common::Clock::now();
  common::Clock::time_point next_ = start_ + std::chrono::seconds(1);
  bool first_ = true;
};

/// Leader side: collects a hello from every other rank until `deadline` (Note [rendezvous
/// admission]), fills (*peers)[rank] (and, under torchrun, c->ring), then answers every rank at
/// once with the ring or the job's error. @throws BootstrapError naming the tasks that never
/// arrived with the refusals seen, or the error of a hello that proved the key, or a key mismatch.
void serve_hellos(ResolvedCluster* c, const common::Socket& listener, common::Deadline deadline,
                  double timeout, std::vector<PeerInfo>* peers);

}  // namespace mwms::bootstrap::detail
