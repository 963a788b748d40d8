// A TCP link: one or more non-blocking stream sockets per peer pair (MWMS_NSOCKS_PERPEER), each
// carrying both directions. Messages are written with sendmsg and read with recvmsg straight
// between the user's buffer and the kernel (vectored I/O, no staging copy; the kernel copies once
// on each side), with as many bytes in flight as the plan allows and the socket buffers hold.
//
// Note [tcp stripes]: with K streams a message's payload is cut into stripes of `stripe_bytes`
// (the pipeline chunk) and stripe j travels on stream j % K; the envelope travels on stream 0
// ahead of that stream's first stripe. Both ends derive the layout from the payload length the
// plan expects, so no per-stripe header is needed, and each stream stays FIFO: a stream carries
// its stripes of message m, then its stripes of message m + 1. A receiver reads every stream
// into the landing area independently and reports as `arrived` the contiguous prefix (the
// lowest first-missing byte over the streams), so chunks are reduced in order while K stripes
// are in flight at once. With K == 1 the whole payload is one stripe: one sendmsg of envelope +
// payload, as before streams existed. One stream is one TCP flow: one congestion window, one
// kernel thread of softirq work, one socket buffer; several let a long fat link or a loaded
// receiver keep more bytes in flight.
//
// Note [tcp wait fd]: with K > 1 the runner sleeps on an epoll descriptor holding the K sockets,
// each registered for exactly what the current messages still need from it (EPOLLIN while a
// stream owes receive bytes, EPOLLOUT while it has allowed bytes it could not write), so the
// descriptor becomes readable when any stream can progress and never for a stream that is done.
// An epoll descriptor only ever polls readable, hence wait_events() answers POLLIN for both
// directions.
//
// Note [tcp peek]: the payload must not land before the runner accepted the envelope (Note
// [accept before landing], link.h), yet a small message should stay one recvmsg. So while the
// envelope is not accepted, stream 0 reads the envelope together with at most kPeekBytes of its
// first stripe into a bounce buffer of the link, and the other streams are not read; once
// accepted, the bounced bytes are copied to the landing area (at most 16 KiB, in cache) and the
// rest is read in place as before. A large message pays one more recvmsg, a small one nothing.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "collective/transport/link.h"
#include "common/socket.h"

namespace mwms::collective {

class TcpLink final : public Link {
 public:
  /// Most streams per peer (MWMS_NSOCKS_PERPEER's upper bound).
  static constexpr int kMaxStreams = 16;

  /// `streams` (1..kMaxStreams connected, non-blocking sockets to `peer`, stream 0 first: the
  /// same order on both ends); `stripe_bytes` (> 0, a multiple of 64) is the stripe of Note
  /// [tcp stripes]. @throws BackendError when the epoll descriptor cannot be made (K > 1).
  TcpLink(int peer, std::vector<common::Socket> streams, std::size_t stripe_bytes);
  const TransportCaps& caps() const noexcept override { return caps_; }
  int peer() const noexcept override { return peer_; }
  bool poll_send(SendSlot& slot) override;
  bool poll_recv(RecvSlot& slot) override;
  RecvView recv_view(const RecvSlot& slot) override;
  void recv_release(RecvSlot& slot, std::size_t bytes) override;
  int wait_fd() const noexcept override;
  short wait_events(short wanted) const noexcept override;

 private:
  struct Stream {
    common::Socket socket;
    std::size_t sent = 0;      // payload bytes of the current outgoing message taken
    std::size_t received = 0;  // payload bytes of the current incoming message read
    bool want_in = false;      // Note [tcp wait fd]
    bool want_out = false;
    std::uint32_t registered = 0;  // epoll events registered now
  };
  std::size_t stripe_for(std::size_t bytes) const noexcept;
  std::size_t share(int stream, std::size_t bytes) const noexcept;
  std::size_t offset(int stream, std::size_t pos, std::size_t stripe) const noexcept;
  void sync_interest(Stream& s);

  int peer_;
  int nstreams_;
  std::size_t stripe_bytes_;
  std::array<Stream, kMaxStreams> streams_;
  static constexpr std::size_t kPeekBytes = 16 << 10;  // Note [tcp peek]
  std::array<char, kPeekBytes> peek_{};
  std::size_t peeked_ = 0;  // payload bytes of the current message waiting in peek_
  common::Socket epoll_;  // K > 1 only (Note [tcp wait fd])
  TransportCaps caps_;
};

/// Caps of every TCP link (chunk_bytes from the communicator's options).
TransportCaps tcp_caps(std::size_t chunk_bytes);

}  // namespace mwms::collective
