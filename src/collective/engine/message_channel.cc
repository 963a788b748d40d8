#include "collective/engine/message_channel.h"

#include <poll.h>
#include <sched.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "common/logging.h"

namespace mwms::collective {

namespace {

constexpr std::size_t kHeader = sizeof(FrameHeader);
constexpr std::size_t kMaxSleepers = 64;  // links one wait re-checks (on the stack, no allocation)

double since(common::Clock::time_point t) {
  return std::chrono::duration<double>(common::Clock::now() - t).count();
}

}  // namespace

MessageChannel::MessageChannel(std::vector<Link*> links, ControlPlane* control,
                               RunnerOptions options)
    : peers_(links.size()), control_(control), options_(options) {
  for (std::size_t p = 0; p < links.size(); ++p) {
    peers_[p].link = links[p];
    // The channel's one allocation: the queues are fixed rings from here on (Note [message
    // channel]: nothing is allocated per message).
    if (links[p] != nullptr) peers_[p].queue.resize(kQueueDepth);
  }
  last_progress_ = common::Clock::now();  // idle time (spin, then sleep) counts from here
}

ErrorContext MessageChannel::with_peer(const ErrorContext& ctx, int peer) const {
  ErrorContext c = control_ != nullptr ? control_->with_peer(ctx, peer) : ctx;
  c.peer_rank = peer;
  const Link* link = peers_[static_cast<std::size_t>(peer)].link;
  if (link != nullptr) c.transport = link->caps().name;
  return c;
}

std::uint64_t MessageChannel::queue_send(int peer, const FrameHeader& header, const void* data,
                                         std::size_t bytes) {
  return queue_send(peer, header, data, bytes, bytes);
}

std::uint64_t MessageChannel::queue_send(int peer, const FrameHeader& header, const void* data,
                                         std::size_t bytes, std::size_t ready) {
  Peer& p = peers_.at(static_cast<std::size_t>(peer));
  MWMS_CHECK(p.link != nullptr, "message to rank " + std::to_string(peer) + " without a link");
  // The failed peer's queue was dropped: a message queued now would silently never leave, so the
  // caller, who should have looked at failed(), hears of it with the peer's error as the cause.
  if (p.failed) {
    try {
      std::rethrow_exception(p.error);
    } catch (const Error& e) {
      throw InvalidUsage("cannot send to rank " + std::to_string(peer) + ", which failed: " +
                             e.message(),
                         e.context());
    }
  }
  // An invariant: protocols keep fewer messages in flight per peer; one more would overwrite a
  // slot the link may still be sending.
  MWMS_CHECK(p.tail - p.head < kQueueDepth, "message queue to rank " + std::to_string(peer) +
                                                " is full");
  Outgoing& o = p.queue[p.tail % kQueueDepth];
  o.header = header;
  o.header.payload_bytes = bytes;  // the receiver checks it against the size it expects
  o.data = static_cast<const char*>(data);
  o.bytes = bytes;
  o.ready = std::min(ready, bytes);
  return p.tail++;
}

void MessageChannel::set_ready(int peer, std::uint64_t ticket, std::size_t ready) noexcept {
  Peer& p = peers_[static_cast<std::size_t>(peer)];
  // A ticket below head was sent (or dropped) already: nothing left to allow.
  if (p.failed || p.retired || ticket < p.head || ticket >= p.tail) return;
  // The message in the link's slot: pump_send() read the queue entry already and now follows
  // `allowed`.
  if (ticket == p.head && p.sending) {
    p.allowed = std::max(p.allowed, std::min(ready, p.send.bytes));
    return;
  }
  Outgoing& o = p.queue[ticket % kQueueDepth];
  o.ready = std::max(o.ready, std::min(ready, o.bytes));
}

void MessageChannel::start_recv(int peer, void* landing, std::size_t bytes) {
  start_recv(peer, landing, bytes, nullptr);
}

void MessageChannel::start_recv(int peer, void* landing, std::size_t bytes, RecvSink* sink) {
  Peer& p = peers_.at(static_cast<std::size_t>(peer));
  MWMS_CHECK(p.link != nullptr, "receive from rank " + std::to_string(peer) + " without a link");
  // One RecvSlot per peer: the link is FIFO, so a second receive could only be the next message.
  MWMS_CHECK(!p.recv_active || p.recv.done(), "a receive from rank " + std::to_string(peer) +
                                                  " is still running");
  // must_land false: every byte is read through recv_view(), so a ring link may hand out its own
  // memory (to the sink in place, or to pump_recv()'s copy) instead of landing it first.
  p.recv.start(static_cast<char*>(landing), bytes, false);
  p.sink = sink;
  p.delivered = 0;
  p.recv_active = true;
  p.recv_checked = false;
}

bool MessageChannel::recv_done(int peer) const noexcept {
  const Peer& p = peers_[static_cast<std::size_t>(peer)];
  return p.recv_active && p.recv_checked && p.recv.done();
}

bool MessageChannel::receiving(int peer) const noexcept {
  const Peer& p = peers_[static_cast<std::size_t>(peer)];
  return p.recv_active && !(p.recv_checked && p.recv.done());
}

bool MessageChannel::header_arrived(int peer) const noexcept {
  const Peer& p = peers_[static_cast<std::size_t>(peer)];
  return p.recv_active && p.recv_checked;
}

const FrameHeader& MessageChannel::recv_header(int peer) const noexcept {
  return peers_[static_cast<std::size_t>(peer)].recv.header;
}

bool MessageChannel::sends_idle(int peer) const noexcept {
  const Peer& p = peers_[static_cast<std::size_t>(peer)];
  return !p.sending && p.head == p.tail;
}

bool MessageChannel::failed(int peer) const noexcept {
  return peers_[static_cast<std::size_t>(peer)].failed;
}

std::exception_ptr MessageChannel::failure(int peer) const noexcept {
  return peers_[static_cast<std::size_t>(peer)].error;
}

bool MessageChannel::retired(int peer) const noexcept {
  return peers_[static_cast<std::size_t>(peer)].retired;
}

void MessageChannel::fail(int peer, std::exception_ptr error) noexcept {
  Peer& p = peers_[static_cast<std::size_t>(peer)];
  if (p.failed || p.retired) return;
  p.failed = true;
  p.error = std::move(error);
  // The queue is dropped: nothing more is read from the callers' buffers for this peer.
  p.head = p.tail;
  p.sending = false;
  p.recv_active = false;
}

void MessageChannel::retire(int peer) noexcept {
  Peer& p = peers_[static_cast<std::size_t>(peer)];
  p.retired = true;
  p.head = p.tail;
  p.sending = false;
  p.recv_active = false;
}

// Called from a catch block: rethrows the link's error to add the peer's context, and keeps the
// result as this peer's failure only (the other peers go on, Note [message channel]).
void MessageChannel::fail_from_link(int p, const ErrorContext& ctx) noexcept {
  try {
    try {
      throw;
    } catch (const PeerError& e) {
      ErrorContext c = with_peer(ctx, p);
      c.cause = FailureCause::kDied;  // a link's PeerError is an end of file, a reset or a close
      throw PeerError(e.message(), c);
    } catch (const BackendError& e) {
      throw BackendError(e.message(), e.native_code(), with_peer(ctx, p));
    }
  } catch (...) {
    fail(p, std::current_exception());
  }
}

bool MessageChannel::pump_send(int p, Peer& peer, const ErrorContext& ctx) {
  if (!peer.sending) {
    if (peer.head == peer.tail) return false;
    const Outgoing& o = peer.queue[peer.head % kQueueDepth];
    peer.send.start(&o.header, o.data, o.bytes, 0);
    peer.allowed = o.ready;
    peer.sending = true;
  }
  // Note [send slices] (message_channel.h).
  peer.send.ready = std::min(peer.allowed, peer.send.sent + kSendSlice);
  bool moved = false;
  try {
    moved = peer.link->poll_send(peer.send);
  } catch (const Error&) {
    fail_from_link(p, ctx);
    return true;
  }
  if (peer.send.done) {
    // Only now is the queue slot free: until `done` the link may still read the caller's data.
    peer.sending = false;
    ++peer.head;
    return true;
  }
  return moved;
}

bool MessageChannel::pump_recv(int p, Peer& peer, const ErrorContext& ctx) {
  if (!peer.recv_active || (peer.recv_checked && peer.recv.done())) return false;
  bool moved = false;
  try {
    moved = peer.link->poll_recv(peer.recv);
  } catch (const Error&) {
    fail_from_link(p, ctx);
    return true;
  }
  if (!peer.recv.header_arrived) return moved;
  if (!peer.recv_checked) {
    const FrameHeader& h = peer.recv.header;
    // The receiver named the size before the message came (Note [message channel]): a different
    // one is a protocol violation, refused before a payload byte is read.
    if (h.magic != kFrameMagic || h.version != kFrameVersion ||
        h.payload_bytes != peer.recv.bytes) {
      ErrorContext c = with_peer(ctx, p);
      std::string why = h.magic != kFrameMagic || h.version != kFrameVersion
                            ? "a corrupt envelope (bad magic or version)"
                            : "a message of " + std::to_string(h.payload_bytes) +
                                  " payload bytes where " + std::to_string(peer.recv.bytes) +
                                  " were expected (" + describe(h) + ")";
      try {  // thrown only to hold it as an exception_ptr: this peer fails, pump() goes on
        throw PeerError("rank " + std::to_string(p) + " sent " + why, c);
      } catch (...) {
        fail(p, std::current_exception());
      }
      return true;
    }
    if (peer.sink != nullptr) {
      try {
        peer.sink->on_envelope(h);
      } catch (const Error&) {
        fail(p, std::current_exception());
        return true;
      }
    }
    peer.recv_checked = true;
    moved = true;
    // Note [accept before landing] (link.h): only now may the link land payload.
    peer.recv.accepted = true;
    // Polled again at once, as link.h asks: a link holding the first payload bytes back (TCP's
    // bounce buffer) lands them now, not one pump later.
    try {
      peer.link->poll_recv(peer.recv);
    } catch (const Error&) {
      fail_from_link(p, ctx);
      return true;
    }
  }
  if (peer.sink != nullptr) {
    try {
      const std::size_t before = peer.recv.consumed;
      consume(peer);
      return moved || peer.recv.consumed != before;
    } catch (const Error&) {
      fail(p, std::current_exception());
      return true;
    }
  }
  // Note [link messages]: consume what arrived; a link that lands bytes in place is not copied.
  RecvSlot& s = peer.recv;
  while (s.arrived > s.consumed) {
    RecvView v = peer.link->recv_view(s);
    if (v.bytes == 0) break;
    // Copied before the release: releasing hands a ring's space back to the producer.
    if (v.data != s.landing + s.consumed) std::memcpy(s.landing + s.consumed, v.data, v.bytes);
    peer.link->recv_release(s, v.bytes);
    moved = true;
  }
  return moved;
}

// Note [receive sink]: the payload goes to the sink where the link holds it (a shared-memory
// ring: no copy into the landing area). Three cases per view of the link's bytes: bytes the link
// landed in place (TCP) are released and delivered from the landing area; a view that starts on
// a unit boundary gives its whole units to the sink directly; a unit split across views (the
// ring's wrap, a producer's partial write) is gathered in the landing area, then delivered from
// there. `delivered` trails `consumed` only by such a partial unit or by in-place bytes.
void MessageChannel::consume(Peer& peer) {
  RecvSlot& s = peer.recv;
  const std::size_t unit = std::max<std::size_t>(1, peer.sink->unit());  // 0 would divide by 0
  while (s.arrived > s.consumed) {
    RecvView v = peer.link->recv_view(s);
    if (v.bytes == 0) break;
    if (v.data == s.landing + s.consumed) {
      peer.link->recv_release(s, v.bytes);
    } else if (s.consumed % unit == 0 && v.bytes >= unit && peer.delivered == s.consumed) {
      const std::size_t n = v.bytes - v.bytes % unit;
      peer.sink->consume(s.consumed, v.data, n);
      peer.link->recv_release(s, n);
      peer.delivered = s.consumed;
    } else {
      const std::size_t n = std::min(v.bytes, unit - s.consumed % unit);
      std::memcpy(s.landing + s.consumed, v.data, n);
      peer.link->recv_release(s, n);
    }
    // Whole units only, but the message's last bytes whatever their size (RecvSink::consume).
    const std::size_t end = s.consumed == s.bytes ? s.bytes : s.consumed - s.consumed % unit;
    if (end > peer.delivered) {
      peer.sink->consume(peer.delivered, s.landing + peer.delivered, end - peer.delivered);
      peer.delivered = end;
    }
  }
}

bool MessageChannel::pump(const ErrorContext& ctx) {
  bool moved = false;
  for (std::size_t i = 0; i < peers_.size(); ++i) {
    Peer& peer = peers_[i];
    if (peer.link == nullptr || peer.failed || peer.retired) continue;
    const int p = static_cast<int>(i);
    // Keep sending while a send completes at once (small messages queue back to back).
    while (!peer.failed && pump_send(p, peer, ctx)) {
      moved = true;
      if (peer.sending) break;  // partial progress: the link is full for now
    }
    if (peer.failed) continue;
    moved = pump_recv(p, peer, ctx) || moved;
  }
  if (moved) ++progress_;  // wait() reads the clock only when this changed, not on every pump
  return moved;
}

// Note [message channel]: a peer that closed its control connection and has nothing left in its
// data link died (or exited without the protocol's goodbye); one silent past the heartbeat's
// loss interval is frozen. Only peers this rank is talking to are judged.
void MessageChannel::check_deaths(const ErrorContext& ctx) noexcept {
  if (control_ == nullptr) return;
  auto lock = control_->hold();  // what the control links delivered is read under reader_
  for (std::size_t i = 0; i < peers_.size(); ++i) {
    Peer& peer = peers_[i];
    const int p = static_cast<int>(i);
    if (peer.link == nullptr || peer.failed || peer.retired) continue;
    const bool busy = peer.recv_active || peer.sending || peer.head != peer.tail;
    if (!busy) continue;
    try {
      // Only links without a descriptor are judged by the control link: a socket reports the
      // peer's death itself, after the bytes it still holds have been read.
      if (control_->closed(p) && peer.link->wait_fd() < 0) {
        ErrorContext c = with_peer(ctx, p);
        c.cause = FailureCause::kDied;
        throw PeerError(control_->name_of(p) + " closed its connections while this rank "
                        "waited for it in " + ctx.op + ": its process died, was killed or "
                        "exited without saying goodbye", c);
      }
      // Note [dead process] (bootstrap/peer_info.cc): only after a while without progress.
      if (since(last_progress_) >= ControlPlane::kProcessCheckSeconds &&
          control_->process_gone(p)) {
        ErrorContext c = with_peer(ctx, p);
        c.cause = FailureCause::kDied;
        throw PeerError(control_->gone_reason(p) + "; this rank waited for it in " + ctx.op, c);
      }
      if (control_->lost(p)) {
        ErrorContext c = with_peer(ctx, p);
        c.cause = FailureCause::kStalled;
        throw PeerError(control_->lost_reason(p) + "; this rank waited for it in " + ctx.op, c);
      }
    } catch (...) {
      fail(p, std::current_exception());
    }
  }
}

void MessageChannel::wait(double max_seconds, const ErrorContext& ctx) {
  if (progress_ != progress_seen_) {
    progress_seen_ = progress_;
    last_progress_ = common::Clock::now();
  }
  // Spin first: a reply is often microseconds away, and a sleep costs a wake-up latency.
  if (since(last_progress_) < options_.spin_seconds) {
    // More ranks than cores on this host: the peer may need this core to make the reply.
    if (options_.yield_while_spinning) {
      sched_yield();
    } else {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
    return;
  }
  // Only once idle: a moving link needs no judging.
  check_deaths(ctx);
  pollfd fds[ControlPlane::kMaxExtra];  // the most ControlPlane::poll() takes beside its own
  int k = 0;
  LinkWait sleepers[kMaxSleepers];  // Note [doorbell]: every link on the first one's doorbell
  std::size_t num_sleepers = 0;
  bool more_fds = false;
  for (Peer& peer : peers_) {
    if (peer.link == nullptr || peer.failed || peer.retired) continue;
    const bool want_read = peer.recv_active && !(peer.recv_checked && peer.recv.done());
    const bool want_write = peer.sending || peer.head != peer.tail;
    if (!want_read && !want_write) continue;
    if (peer.link->wait_fd() < 0) {
      // A link on another doorbell, or past kMaxSleepers, is not slept on: the 2 ms cap below
      // brings this rank back to pump it.
      if (num_sleepers == 0 ||
          (num_sleepers < kMaxSleepers && peer.link->doorbell() != nullptr &&
           peer.link->doorbell() == sleepers[0].link->doorbell())) {
        sleepers[num_sleepers++] = {peer.link, want_write, want_read};
      }
      continue;
    }
    if (k == ControlPlane::kMaxExtra) {
      // Not polled this time: the short cap below brings this rank back to pump them soon.
      more_fds = true;
      continue;
    }
    short events = 0;
    if (want_read) events |= peer.link->wait_events(POLLIN);
    if (want_write) events |= peer.link->wait_events(POLLOUT);
    fds[k++] = {peer.link->wait_fd(), events, 0};
  }
  // Links without a descriptor share this rank's doorbell (Note [doorbell]): wait_links()
  // announces this rank once and re-checks every one of them before the futex sleep, so a peer
  // that moved on any of them is never missed. The sleep stays short (2 ms) only because
  // descriptors are not polled during it.
  // Otherwise poll(2) wakes for every descriptor and control message, and 0.1 s only bounds how
  // late check_deaths() sees a peer that went silent (heartbeat) or whose process is gone.
  double cap = num_sleepers > 0 || more_fds ? 0.002 : 0.1;
  const double sleep = std::max(0.0, std::min(max_seconds, cap));
  if (num_sleepers > 0) {
    wait_links(sleepers, num_sleepers, sleep);
    // Then a look without sleeping again: control messages and the sockets' readiness.
    if (control_ != nullptr) {
      auto lock = control_->hold();
      control_->poll(fds, k, 0, ctx);
    } else if (k > 0) {
      ::poll(fds, static_cast<nfds_t>(k), 0);
    }
  } else if (control_ != nullptr) {
    auto lock = control_->hold();
    // + 1 ms: poll(2) counts whole milliseconds, and a sleep rounded down to 0 would spin.
    control_->poll(fds, k, static_cast<int>(sleep * 1000.0) + 1, ctx);
  } else {
    ::poll(fds, static_cast<nfds_t>(k), static_cast<int>(sleep * 1000.0) + 1);
  }
}

}  // namespace mwms::collective
