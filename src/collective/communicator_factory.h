// Building a communicator: options resolved from CommunicatorOptions and MWMS_* variables, the
// peer-info exchange, one transport per peer, the link mesh and control plane, the backend.
#pragma once

#include <memory>

#include <vector>

#include "bootstrap/peer_info.h"
#include "collective/backend/backend.h"
#include "collective/backend/engine_backend.h"
#include "collective/engine/control_plane.h"
#include "collective/transport/link.h"
#include "mwms/communicator.h"

namespace mwms::collective {

/// Every task of a job connected: one link per peer over the transport chosen for the pair, the
/// control plane (heartbeat running) and the engine options resolved from CommunicatorOptions and
/// MWMS_* variables. What a Communicator is built on, and what the parameter-server mode talks
/// over (Note [ps job mesh] in strategy/ps/parameter_server_strategy.cc): the same links,
/// deadlines, abort relay and authentication.
struct ConnectedJob {
  ResolvedCluster cluster;                   // ring filled in by the rendezvous
  std::vector<bootstrap::PeerInfo> peers;    // by rank; empty for a world of one
  std::vector<std::unique_ptr<Link>> links;  // by rank; null at this rank (size 1 when alone)
  std::unique_ptr<ControlPlane> control;     // null for a world of one
  EngineOptions engine;
  double timeout_seconds = 300;              // every wait of an operation
};

/// Rendezvous, peer-info exchange, links and control plane for `cluster`'s ring
/// (cluster.num_workers ranks; cluster.task_id is this rank). Blocks up to the connect timeout.
/// @throws as Communicator::create documents (except its refusals of kNccl and of ps tasks).
ConnectedJob connect_job(const ResolvedCluster& cluster, const CommunicatorOptions& options);

/// Communicator::create. @throws as documented there.
std::unique_ptr<Communicator> create_communicator(const ResolvedCluster& cluster,
                                                  const CommunicatorOptions& options);

/// The front end over `backend` (null for a world of one).
std::unique_ptr<Communicator> make_front_end(ResolvedCluster cluster,
                                             std::unique_ptr<Backend> backend, double timeout);

}  // namespace mwms::collective
