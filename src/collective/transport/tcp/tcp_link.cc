#include "collective/transport/tcp/tcp_link.h"

#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "common/descriptors.h"
#include "common/logging.h"
#include "mwms/errors.h"

namespace mwms::collective {

namespace {
constexpr std::size_t kHeader = sizeof(FrameHeader);
// iovec entries per sendmsg/recvmsg: a stream's stripes are not contiguous in the buffer, so a
// call covers up to this many of them (plus the envelope); the rest goes in the next call.
constexpr int kMaxIov = 16;
// EINTR: a signal arrived before any byte moved; the runner's next poll retries, as for EAGAIN.
bool would_block(int e) { return e == EAGAIN || e == EWOULDBLOCK || e == EINTR; }
}  // namespace

TransportCaps tcp_caps(std::size_t chunk_bytes) {
  TransportCaps c;
  c.name = "tcp";
  c.chunk_bytes = chunk_bytes;
  return c;
}

TcpLink::TcpLink(int peer, std::vector<common::Socket> streams, std::size_t stripe_bytes)
    : peer_(peer),
      nstreams_(static_cast<int>(streams.size())),
      stripe_bytes_(stripe_bytes),
      caps_(tcp_caps(stripe_bytes)) {
  // An invariant, not a peer error: the stream count was agreed in the hellos before this runs
  // (Note [stream count agreement]).
  MWMS_CHECK(nstreams_ >= 1 && nstreams_ <= kMaxStreams && stripe_bytes_ > 0,
             "bad TCP link to rank " + std::to_string(peer) + ": " + std::to_string(nstreams_) +
                 " streams, stripe " + std::to_string(stripe_bytes));
  caps_.streams = nstreams_;
  for (int i = 0; i < nstreams_; ++i) {
    streams_[static_cast<std::size_t>(i)].socket = std::move(streams[static_cast<std::size_t>(i)]);
  }
  // One stream: the runner polls its socket directly, no epoll set (one descriptor fewer per
  // peer in the budget, no epoll_ctl as interest changes).
  if (nstreams_ == 1) return;
  epoll_ = common::Socket(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_.valid()) {
    const int err = errno;
    throw BackendError(std::string("epoll_create1 for the TCP link to rank ") +
                           std::to_string(peer) + " failed: " + common::errno_description(err),
                       err);
  }
  for (int i = 0; i < nstreams_; ++i) {
    epoll_event ev{};
    ev.events = 0;  // nothing wanted yet (Note [tcp wait fd])
    ev.data.u32 = static_cast<std::uint32_t>(i);
    if (::epoll_ctl(epoll_.fd(), EPOLL_CTL_ADD, streams_[static_cast<std::size_t>(i)].socket.fd(),
                    &ev) != 0) {
      throw BackendError(std::string("epoll_ctl for the TCP link to rank ") +
                             std::to_string(peer) + " failed: " + std::strerror(errno),
                         errno);
    }
  }
}

int TcpLink::wait_fd() const noexcept {
  return nstreams_ == 1 ? streams_[0].socket.fd() : epoll_.fd();
}

short TcpLink::wait_events(short wanted) const noexcept {
  return nstreams_ == 1 ? wanted : static_cast<short>(POLLIN);  // Note [tcp wait fd]
}

// Note [tcp stripes]: one stream carries the whole payload as a single stripe.
std::size_t TcpLink::stripe_for(std::size_t bytes) const noexcept {
  // At least 1: a zero-byte payload must not make share()'s stripe count divide by zero.
  return nstreams_ == 1 ? std::max<std::size_t>(bytes, 1) : stripe_bytes_;
}

// Payload bytes of a `bytes`-long message that travel on `stream`.
std::size_t TcpLink::share(int stream, std::size_t bytes) const noexcept {
  const std::size_t u = stripe_for(bytes);
  const std::size_t k = static_cast<std::size_t>(nstreams_);
  const std::size_t i = static_cast<std::size_t>(stream);
  const std::size_t stripes = (bytes + u - 1) / u;
  if (stripes <= i) return 0;
  const std::size_t mine = (stripes - 1 - i) / k + 1;  // stripes i, i + k, i + 2k, ...: full ones
  std::size_t total = mine * u;
  if ((stripes - 1) % k == i) total -= stripes * u - bytes;  // this stream holds the short last one
  return total;
}

// Message offset of `stream`'s payload byte `pos` (Note [tcp stripes]).
std::size_t TcpLink::offset(int stream, std::size_t pos, std::size_t stripe) const noexcept {
  const std::size_t j = static_cast<std::size_t>(stream) +
                        static_cast<std::size_t>(nstreams_) * (pos / stripe);
  return j * stripe + pos % stripe;
}

void TcpLink::sync_interest(Stream& s) {
  if (nstreams_ == 1) return;
  const std::uint32_t want = (s.want_in ? EPOLLIN : 0u) | (s.want_out ? EPOLLOUT : 0u);
  // Called on every poll: the syscall is paid only when the interest changes.
  if (want == s.registered) return;
  epoll_event ev{};
  ev.events = want;
  ev.data.u32 = static_cast<std::uint32_t>(&s - streams_.data());
  if (::epoll_ctl(epoll_.fd(), EPOLL_CTL_MOD, s.socket.fd(), &ev) != 0) {
    throw BackendError(std::string("epoll_ctl for the TCP link to rank ") +
                           std::to_string(peer_) + " failed: " + std::strerror(errno),
                       errno);
  }
  s.registered = want;
}

bool TcpLink::poll_send(SendSlot& slot) {
  if (slot.done) return false;
  if (slot.link_state == nullptr) {  // a new message (SendSlot::start cleared it)
    for (int i = 0; i < nstreams_; ++i) streams_[static_cast<std::size_t>(i)].sent = 0;
    slot.link_state = this;
  }
  const std::size_t u = stripe_for(slot.bytes);
  bool moved = false;
  for (int i = 0; i < nstreams_; ++i) {
    Stream& s = streams_[static_cast<std::size_t>(i)];
    iovec iov[kMaxIov + 1];
    int k = 0;
    const bool header = i == 0 && slot.header_sent < kHeader;
    if (header) {
      iov[k++] = {const_cast<char*>(reinterpret_cast<const char*>(slot.header)) + slot.header_sent,
                  kHeader - slot.header_sent};
    }
    // Stop at the gate: bytes past `ready` are not final yet (Note [ring gating]).
    for (std::size_t pos = s.sent; k < kMaxIov + (header ? 1 : 0);) {
      const std::size_t off = offset(i, pos, u);
      if (off >= slot.ready) break;  // not allowed yet (gate), or this stream's share is out
      const std::size_t len = std::min(u - pos % u, slot.ready - off);
      iov[k++] = {const_cast<char*>(slot.data) + off, len};
      pos += len;
    }
    s.want_out = false;
    if (k == 0) {
      sync_interest(s);
      continue;
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<std::size_t>(k);
    // MSG_NOSIGNAL: a peer that closed gives EPIPE here, a PeerError, instead of a SIGPIPE that
    // would kill the process. MSG_DONTWAIT: never block whatever the socket's flags.
    const ssize_t n = ::sendmsg(s.socket.fd(), &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) {
      if (!would_block(errno)) {
        throw PeerError("send to rank " + std::to_string(peer_) + " failed: " +
                        std::strerror(errno) + " (the peer process probably died)");
      }
      s.want_out = true;
    } else {
      const std::size_t got = static_cast<std::size_t>(n);
      // The envelope is the first iovec, so a short write takes its bytes first.
      const std::size_t h = header ? std::min(got, kHeader - slot.header_sent) : 0;
      slot.header_sent += h;
      s.sent += got - h;
      slot.sent += got - h;
      moved = moved || got > 0;
      // Still owes allowed bytes: the socket buffer is full (a short write).
      s.want_out = (i == 0 && slot.header_sent < kHeader) || offset(i, s.sent, u) < slot.ready;
    }
    sync_interest(s);
  }
  // `done` means the kernel holds every byte: the caller may reuse the buffer (link.h).
  slot.done = slot.header_sent == kHeader && slot.sent == slot.bytes;
  return moved || slot.done;
}

bool TcpLink::poll_recv(RecvSlot& slot) {
  if (slot.header_arrived && slot.arrived == slot.bytes) return false;
  if (slot.link_state == nullptr) {  // a new message (RecvSlot::start cleared it)
    for (int i = 0; i < nstreams_; ++i) streams_[static_cast<std::size_t>(i)].received = 0;
    peeked_ = 0;
    slot.link_state = this;
  }
  // Until the envelope is checked the payload length is the one the plan expects; the runner
  // checks the envelope before it reads any payload byte, and nothing lands before it accepted
  // the envelope (Note [tcp peek]).
  const std::size_t u = stripe_for(slot.bytes);
  const bool accepted = slot.accepted;
  if (accepted && peeked_ > 0) {
    std::memcpy(slot.landing, peek_.data(), peeked_);  // stream 0's first bytes: offsets 0..
    peeked_ = 0;
  }
  // Within stream 0's first stripe (message offsets 0.., so the bounce copies to landing[0..))
  // and within its share: a byte further would be the next message's, which this one's
  // acceptance does not cover.
  const std::size_t peek_limit = std::min({kPeekBytes, share(0, slot.bytes), u});
  bool moved = false;
  std::size_t contiguous = slot.bytes;
  for (int i = 0; i < nstreams_; ++i) {
    Stream& s = streams_[static_cast<std::size_t>(i)];
    const std::size_t mine = share(i, slot.bytes);
    // Their bytes may only land in place, after acceptance: until then the socket buffer holds
    // them (and flow control slows the sender).
    if (!accepted && i > 0) {  // read once the envelope is accepted
      s.want_in = false;
      sync_interest(s);
      continue;
    }
    iovec iov[kMaxIov + 1];
    int k = 0;
    const bool header = i == 0 && slot.header_got < kHeader;
    if (header) {
      iov[k++] = {reinterpret_cast<char*>(&slot.header) + slot.header_got,
                  kHeader - slot.header_got};
    }
    if (!accepted) {
      if (s.received < peek_limit) iov[k++] = {peek_.data() + s.received, peek_limit - s.received};
    } else {
      // Bounded by `mine`: the stream carries the next message's stripes right behind these.
      for (std::size_t pos = s.received; pos < mine && k < kMaxIov + (header ? 1 : 0);) {
        const std::size_t off = offset(i, pos, u);
        const std::size_t len = std::min(u - pos % u, slot.bytes - off);
        iov[k++] = {slot.landing + off, len};
        pos += len;
      }
    }
    if (k > 0) {
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = static_cast<std::size_t>(k);
      const ssize_t n = ::recvmsg(s.socket.fd(), &msg, MSG_DONTWAIT);
      if (n == 0) {  // end of file: a receive is owed, so the peer went away, not finished
        throw PeerError("rank " + std::to_string(peer_) + " closed the connection in the middle "
                        "of a collective (the peer process probably died or aborted)");
      }
      if (n < 0 && !would_block(errno)) {
        throw PeerError("receive from rank " + std::to_string(peer_) + " failed: " +
                        std::strerror(errno));
      }
      if (n > 0) {
        const std::size_t got = static_cast<std::size_t>(n);
        const std::size_t h = header ? std::min(got, kHeader - slot.header_got) : 0;
        slot.header_got += h;
        s.received += got - h;
        if (!accepted) peeked_ = s.received;
        moved = true;
      }
    }
    s.want_in = s.received < mine || (i == 0 && slot.header_got < kHeader);
    sync_interest(s);
    if (s.received < mine) contiguous = std::min(contiguous, offset(i, s.received, u));
  }
  slot.header_arrived = slot.header_got == kHeader;
  // Bounced bytes are not at `landing` yet, and recv_view() reads only there.
  slot.arrived = accepted ? contiguous : 0;
  return moved;
}

RecvView TcpLink::recv_view(const RecvSlot& slot) {
  return {slot.landing + slot.consumed, slot.arrived - slot.consumed};
}

void TcpLink::recv_release(RecvSlot& slot, std::size_t bytes) { slot.consumed += bytes; }

}  // namespace mwms::collective
