// The socket mesh (two-phase through bootstrap, STYLE item 27): after the peer-info exchange
// every rank knows every listen address, and for each pair of ranks the higher rank connects to
// the lower one's listener: always one control link (engine/control_plane.h) and, where the
// pair's transport asks for them (Transport::mesh_sockets_per_peer, TCP's data streams), that
// many more sockets. Each connection opens with the handshake of bootstrap/handshake.h (with
// MWMS_AUTH_KEY: a proof of the key both ways) naming the connecting rank, the cluster
// fingerprint, the link's purpose, the transport the connecting rank chose for the pair and, for
// a transport's sockets, the socket's index and count, which the accepting rank checks against
// its own choices. The mesh knows no transport: it opens what MeshPlan says.
#pragma once

#include <string>
#include <vector>

#include "common/socket.h"
#include "mwms/cluster.h"

namespace mwms::collective {

/// What the mesh opens, by rank (this rank's entries unused): the name of the transport chosen
/// for the pair (sent in every hello and compared with the peer's) and how many sockets that
/// transport wants for the pair (0: the control link only). Every rank must compute the same
/// plan for its pairs (choose_transports does).
struct MeshPlan {
  std::vector<std::string> transport;
  std::vector<int> sockets;
};

struct MeshSockets {
  std::vector<common::Socket> control;  // by rank (invalid for this rank)
  // By rank, then socket index: MeshPlan::sockets of them for the pair, none elsewhere.
  std::vector<std::vector<common::Socket>> data;
};

/// Connects the mesh of rank cluster.task_id: control links to every peer, plan.sockets[peer]
/// transport sockets to each peer (each hello naming its index and the count). Control sockets
/// are tuned for latency (common::tune_stream_socket); a transport's sockets are left to it.
/// Blocks until connected or `timeout_seconds`. @throws BootstrapError naming the peer that
/// could not be reached, failed the key handshake (key mismatch), chose another transport for
/// the pair or opens another number of sockets; BootstrapTimeoutError naming the peers that
/// never connected within `timeout_seconds`.
MeshSockets connect_mesh(const ResolvedCluster& cluster, const common::Socket& listener,
                         const MeshPlan& plan, double timeout_seconds);

}  // namespace mwms::collective
