#include "collective/transport/tcp/tcp_link.h"

#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "mwms/errors.h"

namespace mwms::collective {

namespace {
constexpr std::size_t kHeader = sizeof(FrameHeader);
bool would_block(int e) { return e == EAGAIN || e == EWOULDBLOCK || e == EINTR; }
}  // namespace

TransportCaps tcp_caps(std::size_t chunk_bytes) {
  TransportCaps c;
  c.name = "tcp";
  c.pollable = true;
  c.chunk_bytes = chunk_bytes;
  return c;
}

TcpLink::TcpLink(int peer, common::Socket socket) : peer_(peer), socket_(std::move(socket)) {}

const TransportCaps& TcpLink::caps() const noexcept {
  static const TransportCaps c = tcp_caps(256 << 10);
  return c;
}

bool TcpLink::poll_send(SendSlot& slot) {
  if (slot.done) return false;
  iovec iov[2];
  int k = 0;
  if (slot.header_sent < kHeader) {
    iov[k++] = {const_cast<char*>(reinterpret_cast<const char*>(slot.header)) + slot.header_sent,
                kHeader - slot.header_sent};
  }
  if (slot.ready > slot.sent) iov[k++] = {const_cast<char*>(slot.data) + slot.sent, slot.ready - slot.sent};
  if (k == 0) return false;  // waiting for the runner to allow more (gate)
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = static_cast<std::size_t>(k);
  ssize_t n = ::sendmsg(socket_.fd(), &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
  if (n < 0) {
    if (would_block(errno)) return false;
    throw PeerError("send to rank " + std::to_string(peer_) + " failed: " + std::strerror(errno) +
                    " (the peer process probably died)");
  }
  std::size_t got = static_cast<std::size_t>(n);
  std::size_t h = std::min(got, kHeader - slot.header_sent);
  slot.header_sent += h;
  slot.sent += got - h;
  slot.done = slot.header_sent == kHeader && slot.sent == slot.bytes;
  return got > 0;
}

bool TcpLink::poll_recv(RecvSlot& slot) {
  if (slot.header_arrived && slot.arrived == slot.bytes) return false;
  iovec iov[2];
  int k = 0;
  if (slot.header_got < kHeader) {
    iov[k++] = {reinterpret_cast<char*>(&slot.header) + slot.header_got, kHeader - slot.header_got};
  }
  // Until the envelope is checked the payload length is the one the plan expects; the runner
  // checks the envelope before it reads any payload byte.
  if (slot.bytes > slot.arrived) iov[k++] = {slot.landing + slot.arrived, slot.bytes - slot.arrived};
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = static_cast<std::size_t>(k);
  ssize_t n = ::recvmsg(socket_.fd(), &msg, MSG_DONTWAIT);
  if (n == 0) {
    throw PeerError("rank " + std::to_string(peer_) + " closed the connection in the middle of a "
                    "collective (the peer process probably died or aborted)");
  }
  if (n < 0) {
    if (would_block(errno)) return false;
    throw PeerError("receive from rank " + std::to_string(peer_) + " failed: " +
                    std::strerror(errno));
  }
  std::size_t got = static_cast<std::size_t>(n);
  std::size_t h = std::min(got, kHeader - slot.header_got);
  slot.header_got += h;
  slot.arrived += got - h;
  slot.header_arrived = slot.header_got == kHeader;
  return true;
}

RecvView TcpLink::recv_view(const RecvSlot& slot) {
  return {slot.landing + slot.consumed, slot.arrived - slot.consumed};
}

void TcpLink::recv_release(RecvSlot& slot, std::size_t bytes) { slot.consumed += bytes; }

}  // namespace mwms::collective
