// The TCP transport (Note [transport table]): links over MWMS_NSOCKS_PERPEER sockets per pair
// (streams, Note [tcp stripes]) that the socket mesh (collective/mesh/socket_mesh.h) opens and
// authenticates beside the control links, because this transport asks for them
// (mesh_sockets_per_peer). Its blob, {"streams":N}, lets both ends of a pair compare their
// stream counts before any link is opened (Note [stream count agreement]). The transport of
// last resort under auto: every rank with a listener can reach every other.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "collective/transport/transport.h"

namespace mwms::collective {

/// MWMS_NSOCKS_PERPEER: TCP streams per peer pair (1..TcpLink::kMaxStreams, default 1).
/// @throws InvalidArgument naming the value when it is outside that range.
int tcp_streams_per_peer();
/// MWMS_SOCKET_BUFFER_BYTES: send and receive buffer of each data socket; 0 (the default) leaves
/// them to the kernel's autotuning (Note [socket buffers] in tcp_transport.cc).
/// @throws InvalidArgument when it is outside 0..1 GiB.
long long socket_buffer_bytes();

/// The TCP transport; `chunk_bytes` is also the stripe of links with several streams
/// (Note [tcp stripes]).
class TcpTransport final : public Transport {
 public:
  /// @throws InvalidArgument for a bad MWMS_NSOCKS_PERPEER or MWMS_SOCKET_BUFFER_BYTES.
  explicit TcpTransport(std::size_t chunk_bytes);
  const TransportCaps& caps() const noexcept override { return caps_; }
  /// {"streams":N} with N = tcp_streams_per_peer().
  std::string local_address() const override;
  int mesh_sockets_per_peer() const noexcept override { return streams_; }
  /// Note [stream count agreement]: compares this rank's stream count with every peer's "tcp"
  /// blob. @throws BootstrapError naming MWMS_NSOCKS_PERPEER, both values and the peer's task,
  /// rank and address; both ends of the pair throw the same way.
  void check_peers(const std::vector<int>& peers, const ConnectContext& ctx) const override;
  /// One TcpLink per peer over the sockets the mesh opened (ctx.sockets), tuned and sized
  /// (Note [socket buffers]). Does not block.
  std::vector<std::unique_ptr<Link>> connect(const std::vector<int>& peers,
                                             const ConnectContext& ctx) override;

 private:
  int streams_;
  long long buffer_bytes_;
  TransportCaps caps_;
};

/// The table's row (transport/registry.cc).
extern const TransportEntry kTcpTransportEntry;

}  // namespace mwms::collective
