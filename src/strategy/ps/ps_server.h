// One parameter server: holds the shards placed on it, applies the optimizer to them and answers
// the workers (Note [ps messages] in ps_protocol.h), in synchronous or asynchronous mode.
//
// Note [ps serving]: one thread serves every worker through the message channel; each worker has
// one request in flight at a time, so per worker the ps is a small state machine (waiting for a
// request, receiving its description, values or gradients, or holding its reply). Replies are
// sent from the ps's own shard buffer, so no update is applied while a reply is still being sent
// (every reply holds one consistent version). Synchronous (SyncReplicasOptimizer): a gradient
// computed on the current version is summed into the accumulator and its reply held; one from an
// older version is dropped and answered at once with the current values; when
// replicas_to_aggregate gradients are in (fewer once workers are lost or gone: the live ones),
// their mean is applied, the version advances and every held reply goes out. Asynchronous: each
// gradient is applied on arrival; its staleness is the version now minus the version the worker
// pulled; with max_staleness, the reply of a worker more than that many pushes ahead of the
// slowest live worker is held until it is not. Note [ps streamed apply] (ps_server_steps.cc):
// pushes are consumed straight from the link as they arrive, one at a time, and replies go out as
// the update reaches their bytes (Note [ps step pipeline]). PsServer::State, shared by
// ps_server.cc, ps_server_steps.cc and ps_server_admin.cc, is in ps_server_state.h.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "collective/engine/message_channel.h"
#include "mwms/parameter_server.h"
#include "strategy/ps/ps_protocol.h"

namespace mwms::strategy::ps {

struct ServerConfig {
  int ps_index = 0;
  std::vector<int> workers;   // ranks of the training tasks, in task id order
  std::vector<std::string> worker_names;
  std::vector<char> worker_shm;  // by worker: its link is shared memory (Note [ps shared values])
  bool shared_values = false;    // keep the values in shared memory for those workers
  int chief = 0;              // rank of the chief (or worker 0)
  double timeout_seconds = 300;
  ErrorContext ctx;           // this task's rank and name
};

class PsServer {
 public:
  PsServer(collective::MessageChannel& channel, ServerConfig config);
  ~PsServer();
  /// Serves until the chief ended the job and every other worker said goodbye or was lost.
  /// @throws PeerError naming the chief when it failed before ending the job; PeerError when
  ///   every worker was lost; CollectiveMismatchError for a chief whose init is malformed.
  ParameterServerStats serve();

 private:
  struct State;
  std::unique_ptr<State> st_;
};

}  // namespace mwms::strategy::ps
