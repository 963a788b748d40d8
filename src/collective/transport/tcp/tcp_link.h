// A TCP link: one non-blocking stream socket per peer pair, carrying both directions. Messages
// are written with one sendmsg of envelope + payload and read with one recvmsg straight into the
// landing area (no staging copy; the kernel copies once on each side).
#pragma once

#include "collective/transport/link.h"
#include "common/socket.h"

namespace mwms::collective {

class TcpLink final : public Link {
 public:
  TcpLink(int peer, common::Socket socket);
  const TransportCaps& caps() const noexcept override;
  int peer() const noexcept override { return peer_; }
  bool poll_send(SendSlot& slot) override;
  bool poll_recv(RecvSlot& slot) override;
  RecvView recv_view(const RecvSlot& slot) override;
  void recv_release(RecvSlot& slot, std::size_t bytes) override;
  int wait_fd() const noexcept override { return socket_.fd(); }

 private:
  int peer_;
  common::Socket socket_;
};

/// Caps of every TCP link (chunk_bytes from the communicator's options).
TransportCaps tcp_caps(std::size_t chunk_bytes);

}  // namespace mwms::collective
