// TCP transport and the socket mesh (two-phase through bootstrap, STYLE item 27). After the
// peer-info exchange every rank knows every listen address. For each pair of ranks the higher rank
// connects to the lower one's listener: always a control link (engine/control_plane.h) and, when
// the pair's data goes over TCP, MWMS_NSOCKS_PERPEER data links (streams). Each connection opens
// with the handshake of bootstrap/handshake.h (with MWMS_AUTH_KEY: a proof of the key both ways)
// naming the connecting rank, the cluster fingerprint, the link's purpose, the transport the
// connecting rank chose for the pair and, for data links, the stream's index and the stream
// count, which the accepting rank checks against its own choices.
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
  // By rank, then stream (Note [tcp stripes]): MWMS_NSOCKS_PERPEER sockets where the pair's
  // transport is TCP, none elsewhere.
  std::vector<std::vector<common::Socket>> data;
};

/// MWMS_NSOCKS_PERPEER: TCP streams per peer pair (1..TcpLink::kMaxStreams, default 1).
/// @throws InvalidArgument naming the value when it is outside that range.
int tcp_streams_per_peer();
/// MWMS_SOCKET_BUFFER_BYTES: send and receive buffer of each data socket; 0 (the default) leaves
/// them to the kernel's autotuning (Note [socket buffers] in tcp_transport.cc).
/// @throws InvalidArgument when it is outside 0..1 GiB.
long long socket_buffer_bytes();

/// The "tcp" blob of this rank's peer info: {"streams":N} with N = tcp_streams_per_peer(), so
/// that both ends of a pair can compare their stream counts before any link is opened
/// (Note [stream count agreement] in tcp_transport.cc). @throws InvalidArgument as
/// tcp_streams_per_peer().
std::string tcp_address_blob();

/// Compares this rank's stream count with every peer's "tcp" blob where kinds[peer] == kTcp
/// (`peers` by rank, from the peer-info exchange). A peer without the blob is left to the data
/// link hello check of connect_mesh. Does not block.
/// @throws BootstrapError naming MWMS_NSOCKS_PERPEER, both values and the peer's task, rank and
///   address; both ends of the pair throw the same way.
void check_tcp_streams(const ResolvedCluster& cluster,
                       const std::vector<bootstrap::PeerInfo>& peers,
                       const std::vector<TransportKind>& kinds);

/// Connects the mesh of rank cluster.task_id: control links to every peer, TCP data links to the
/// peers with kinds[peer] == kTcp (tcp_streams_per_peer() of them per peer, each hello naming its
/// stream and the count). `kinds` is by rank and must be what every rank computes for its pairs.
/// Blocks until connected or `timeout_seconds`. @throws BootstrapError naming the peer that
/// could not be reached, never connected within `timeout_seconds`, failed the key handshake (key
/// mismatch), chose another transport for the pair or opens another number of streams;
/// InvalidArgument for a bad MWMS_NSOCKS_PERPEER or MWMS_SOCKET_BUFFER_BYTES.
MeshSockets connect_mesh(const ResolvedCluster& cluster, const common::Socket& listener,
                         const std::vector<TransportKind>& kinds, double timeout_seconds);

/// The TCP transport over the data sockets of a mesh; `chunk_bytes` is also the stripe of links
/// with several streams (Note [tcp stripes]).
class TcpTransport final : public Transport {
 public:
  TcpTransport(std::vector<std::vector<common::Socket>> data, std::size_t chunk_bytes);
  TransportKind kind() const noexcept override { return TransportKind::kTcp; }
  const TransportCaps& caps() const noexcept override { return caps_; }
  std::string local_address() const override { return ""; }
  std::vector<std::unique_ptr<Link>> connect(const std::vector<int>& peers,
                                             const ConnectContext& ctx) override;

 private:
  std::vector<std::vector<common::Socket>> data_;
  TransportCaps caps_;
};

}  // namespace mwms::collective
