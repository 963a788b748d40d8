// TCP transport and the socket mesh (two-phase through bootstrap, STYLE item 27). After the
// peer-info exchange every rank knows every listen address. For each pair of ranks the higher rank
// connects to the lower one's listener: always a control link (engine/control_plane.h) and, when
// the pair's data goes over TCP, a data link. Each connection opens with the handshake of
// bootstrap/handshake.h (with MWMS_AUTH_KEY: a proof of the key both ways) naming the connecting
// rank, the cluster fingerprint, the link's purpose and the transport the connecting rank chose
// for the pair, which the accepting rank checks against its own choice.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "collective/transport/transport.h"
#include "common/socket.h"
#include "mwms/cluster.h"

namespace mwms::collective {

struct MeshSockets {
  std::vector<common::Socket> control;  // by rank (invalid for this rank)
  std::vector<common::Socket> data;     // by rank: valid where the pair's transport is TCP
};

/// Connects the mesh of rank cluster.task_id: control links to every peer, TCP data links to the
/// peers with kinds[peer] == kTcp. `kinds` is by rank and must be what every rank computes for
/// its pairs. @throws BootstrapError naming the peer that could not be reached, never connected
/// within `timeout_seconds`, failed the key handshake (key mismatch), or chose another transport
/// for the pair.
MeshSockets connect_mesh(const ResolvedCluster& cluster, const common::Socket& listener,
                         const std::vector<TransportKind>& kinds, double timeout_seconds);

/// The TCP transport over the data sockets of a mesh.
class TcpTransport final : public Transport {
 public:
  TcpTransport(std::vector<common::Socket> data, std::size_t chunk_bytes);
  TransportKind kind() const noexcept override { return TransportKind::kTcp; }
  const TransportCaps& caps() const noexcept override { return caps_; }
  std::string local_address() const override { return ""; }
  std::vector<std::unique_ptr<Link>> connect(const std::vector<int>& peers,
                                             const ConnectContext& ctx) override;

 private:
  std::vector<common::Socket> data_;
  TransportCaps caps_;
};

}  // namespace mwms::collective
