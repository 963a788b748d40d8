#include "collective/transport/tcp/tcp_ring_channel.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/logging.h"

namespace mwms::collective {

namespace {
constexpr std::size_t kHeader = sizeof(FrameHeader);

int next_with_send(const Transfer* ts, int n, int i) {
  while (i < n && !ts[i].has_send) ++i;
  return i;
}
int next_with_recv(const Transfer* ts, int n, int i) {
  while (i < n && !ts[i].has_recv) ++i;
  return i;
}
double since(common::Clock::time_point t) {
  return std::chrono::duration<double>(common::Clock::now() - t).count();
}
}  // namespace

struct TcpRingChannel::State {
  int s = 0;                 // current send transfer
  std::size_t s_off = 0;     // bytes of (header + payload) sent
  int r = 0;                 // current receive transfer
  std::size_t r_off = 0;     // bytes of (header + payload) received
  std::size_t r_done = 0;    // payload bytes finalised (Note [ring gating])
  bool r_checked = false;
  FrameHeader r_header;
  common::Clock::time_point last_progress = common::Clock::now();
  common::Clock::time_point start = common::Clock::now();
};

// Payload bytes of the current send transfer that may go out now (Note [ring gating]).
std::size_t TcpRingChannel::send_limit(const Transfer& t, const State& st) {
  if (t.send_gate < 0 || t.send_gate < st.r) return t.send_bytes;
  return t.send_gate == st.r ? std::min(t.send_bytes, st.r_done) : 0;
}

TcpRingChannel::TcpRingChannel(common::Socket data_next, common::Socket data_prev,
                               common::Socket ctrl_next, common::Socket ctrl_prev,
                               RingNeighbours neighbours, std::size_t chunk_bytes,
                               double spin_seconds)
    : data_next_(std::move(data_next)),
      data_prev_(std::move(data_prev)),
      ctrl_next_(std::move(ctrl_next)),
      ctrl_prev_(std::move(ctrl_prev)),
      nb_(std::move(neighbours)),
      chunk_bytes_(chunk_bytes),
      spin_seconds_(spin_seconds) {}

ErrorContext TcpRingChannel::with_peer(ErrorContext ctx, int peer) const {
  ctx.peer_rank = peer;
  if (peer >= 0 && peer < static_cast<int>(nb_.addresses.size())) {
    ctx.peer_address = nb_.addresses[peer];
    ctx.peer_task = nb_.tasks[peer];
  }
  ctx.transport = "tcp";
  return ctx;
}

bool TcpRingChannel::pump_send(Transfer* ts, int n, State& st, const ErrorContext& ctx) {
  if (st.s >= n) return false;
  Transfer& t = ts[st.s];
  std::size_t limit = send_limit(t, st);
  if (st.s_off >= kHeader + limit) return false;  // waiting for our own receive (gate)
  iovec iov[2];
  int k = 0;
  if (st.s_off < kHeader) {
    iov[k++] = {reinterpret_cast<char*>(&t.send_header) + st.s_off, kHeader - st.s_off};
    if (limit > 0) iov[k++] = {const_cast<char*>(t.send), limit};
  } else {
    std::size_t done = st.s_off - kHeader;
    iov[k++] = {const_cast<char*>(t.send) + done, limit - done};
  }
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = static_cast<std::size_t>(k);
  ssize_t sent = ::sendmsg(data_next_.fd(), &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
  if (sent < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return false;
    int saved = errno;
    drain_abort(ctrl_next_.fd(), nb_.next_rank, ctx);
    errno = saved;
    throw PeerError(std::string("send to next rank failed: ") + std::strerror(errno) +
                        " (the peer process probably died)",
                    with_peer(ctx, nb_.next_rank));
  }
  st.s_off += static_cast<std::size_t>(sent);
  if (st.s_off == kHeader + t.send_bytes) {
    st.s = next_with_send(ts, n, st.s + 1);
    st.s_off = 0;
  }
  return true;
}

bool TcpRingChannel::pump_recv(Transfer* ts, int n, ChunkSink* sink, State& st,
                               const ErrorContext& ctx) {
  if (st.r >= n) return false;
  Transfer& t = ts[st.r];
  if (t.recv_gate >= 0 && st.s <= t.recv_gate) return false;  // buffer still being sent
  iovec iov[2];
  int k = 0;
  if (st.r_off < kHeader) {
    iov[k++] = {reinterpret_cast<char*>(&st.r_header) + st.r_off, kHeader - st.r_off};
    if (t.recv_bytes > 0) iov[k++] = {t.recv, t.recv_bytes};
  } else {
    std::size_t done = st.r_off - kHeader;
    iov[k++] = {t.recv + done, t.recv_bytes - done};
  }
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = static_cast<std::size_t>(k);
  ssize_t got = ::recvmsg(data_prev_.fd(), &msg, MSG_DONTWAIT);
  if (got <= 0 && !(got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))) {
    int saved = errno;
    drain_abort(ctrl_prev_.fd(), nb_.prev_rank, ctx);  // the peer may have told us why it left
    errno = saved;
  }
  if (got == 0) {
    throw PeerError("previous rank closed the connection in the middle of a collective (the peer "
                    "process probably died or aborted)",
                    with_peer(ctx, nb_.prev_rank));
  }
  if (got < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return false;
    throw PeerError(std::string("receive from previous rank failed: ") + std::strerror(errno),
                    with_peer(ctx, nb_.prev_rank));
  }
  st.r_off += static_cast<std::size_t>(got);
  if (st.r_off < kHeader) return true;
  if (!st.r_checked) {
    check_frame(t.expect_header, st.r_header, with_peer(ctx, nb_.prev_rank));
    st.r_checked = true;
  }
  std::size_t arrived = st.r_off - kHeader;
  if (!t.recv_in_chunks) {
    st.r_done = arrived;
  } else {
    // Reduce whole chunks while they are hot in cache; the tail once the payload is complete.
    while (arrived - st.r_done >= chunk_bytes_ || (arrived == t.recv_bytes && st.r_done < arrived)) {
      std::size_t end = std::min(st.r_done + chunk_bytes_, arrived);
      sink->on_chunk(st.r, st.r_done, end);
      st.r_done = end;
    }
  }
  if (arrived == t.recv_bytes) {
    st.r = next_with_recv(ts, n, st.r + 1);
    st.r_off = 0;
    st.r_done = 0;
    st.r_checked = false;
  }
  return true;
}

void TcpRingChannel::check_control(int fd, int from_rank, const ErrorContext& ctx) {
  FrameHeader h;
  common::IoResult res = common::read_exact(fd, &h, kHeader, common::deadline_after(1.0));
  if (res.status == common::IoStatus::kOk && h.magic == kFrameMagic &&
      h.kind == static_cast<std::uint8_t>(CollectiveKind::kStallNotice)) {
    // Note [stall blame]: only notices about this collective, from our predecessor, count.
    if (from_rank == nb_.prev_rank && static_cast<std::int64_t>(h.seq) == ctx.seq &&
        h.root != blamed_upstream_) {
      blamed_upstream_ = h.root;
      if (notice_sent_for_ != -2) send_stall_notice(h.seq);
    }
    return;
  }
  bool valid = res.status == common::IoStatus::kOk && h.magic == kFrameMagic &&
               h.kind == static_cast<std::uint8_t>(CollectiveKind::kAbort);
  if (!valid) {
    // A neighbour that exits closes its control connection; that alone is not a failure (it may
    // have finished). If it died mid-collective, the data connection reports it.
    (fd == ctrl_next_.fd() ? ctrl_next_open_ : ctrl_prev_open_) = false;
    return;
  }
  const std::uint64_t payload = h.payload_bytes;  // packed field: copy, never bind a reference
  std::string reason(std::min<std::uint64_t>(payload, kMaxAbortReasonBytes), '\0');
  common::read_exact(fd, reason.data(), reason.size(), common::deadline_after(1.0));
  send_abort(h.root, reason, static_cast<AbortCause>(h.op));
  std::string text = "rank " + std::to_string(h.root) + " failed: " + reason +
                     " (abort relayed by rank " + std::to_string(from_rank) + ")";
  ErrorContext c = with_peer(ctx, h.root);
  // Re-raise with the class the failing rank saw, so every rank can react the same way.
  if (h.op == static_cast<std::uint8_t>(AbortCause::kMismatch)) throw CollectiveMismatchError(text, c);
  if (h.op == static_cast<std::uint8_t>(AbortCause::kTimeout)) throw TimeoutError(text, c);
  throw PeerError(text, c);
}

void TcpRingChannel::wait_for_io(const State& st, double timeout_seconds,
                                 const ErrorContext& ctx) {
  double idle = since(st.last_progress);
  if (idle < spin_seconds_) return;  // poll the sockets again without sleeping
  pollfd fds[4];
  int k = 0;
  fds[k++] = {data_prev_.fd(), POLLIN, 0};
  fds[k++] = {data_next_.fd(), POLLOUT, 0};
  int ctrl_base = k;
  if (ctrl_next_open_) fds[k++] = {ctrl_next_.fd(), POLLIN, 0};
  if (ctrl_prev_open_) fds[k++] = {ctrl_prev_.fd(), POLLIN, 0};
  double left = timeout_seconds - idle;
  if (wait_on_prev_ && idle > timeout_seconds / 2 && notice_sent_for_ == -2) {
    send_stall_notice(static_cast<std::uint64_t>(ctx.seq));
  }
  if (left <= 0) {
    // Waiting on the predecessor while a receive is pending, otherwise on the successor.
    int peer = wait_on_prev_ ? nb_.prev_rank : nb_.next_rank;
    std::string via;
    if (wait_on_prev_ && blamed_upstream_ >= 0 && blamed_upstream_ != peer) {
      via = " (rank " + std::to_string(peer) + " is waiting for it too)";
      peer = blamed_upstream_;
    }
    ErrorContext c = with_peer(ctx, peer);
    c.elapsed_seconds = since(st.start);
    c.timeout_seconds = timeout_seconds;
    throw TimeoutError("no progress from rank " + std::to_string(peer) + " for " +
                           std::to_string(static_cast<int>(timeout_seconds)) +
                           " s" + via +
                           " (the peer is stalled, overloaded or stuck before this collective)",
                       c);
  }
  // Only wait for the directions that can make progress (set by run()).
  if (!want_read_) fds[0].fd = -1;
  if (!want_write_) fds[1].fd = -1;
  int ms = static_cast<int>(std::min(left * 1000.0 + 1, 100.0));
  int rc = ::poll(fds, static_cast<nfds_t>(k), ms);
  if (rc <= 0) return;
  // Data first: an abort only interrupts a rank that cannot make progress, so a rank whose data
  // for this collective has already arrived completes it.
  if (fds[0].revents != 0 || fds[1].revents != 0) return;
  for (int i = ctrl_base; i < k; ++i) {
    if (fds[i].revents != 0) {
      bool is_next = fds[i].fd == ctrl_next_.fd();
      check_control(fds[i].fd, is_next ? nb_.next_rank : nb_.prev_rank, ctx);
    }
  }
}

void TcpRingChannel::run(Transfer* ts, int n, ChunkSink* sink, double timeout_seconds,
                         ErrorContext ctx) {
  ctx.transport = "tcp";
  State st;
  blamed_upstream_ = -1;
  notice_sent_for_ = -2;
  st.s = next_with_send(ts, n, 0);
  st.r = next_with_recv(ts, n, 0);
  while (st.s < n || st.r < n) {
    bool progressed = pump_recv(ts, n, sink, st, ctx);
    progressed = pump_send(ts, n, st, ctx) || progressed;
    if (progressed) {
      st.last_progress = common::Clock::now();
      continue;
    }
    // What can move: a receive that is not gated on our own send, a send with bytes allowed.
    want_read_ = st.r < n && !(ts[st.r].recv_gate >= 0 && st.s <= ts[st.r].recv_gate);
    want_write_ = st.s < n && st.s_off < kHeader + send_limit(ts[st.s], st);
    wait_on_prev_ = want_read_ || (st.s < n && !want_write_);
    wait_for_io(st, timeout_seconds, ctx);
  }
}

void TcpRingChannel::drain_abort(int fd, int from_rank, const ErrorContext& ctx) {
  // A neighbour that fails sends its abort before it closes; give it a moment to arrive.
  pollfd p{fd, POLLIN, 0};
  if (fd >= 0 && ::poll(&p, 1, 250) > 0) check_control(fd, from_rank, ctx);
}

void TcpRingChannel::send_stall_notice(std::uint64_t seq) noexcept {
  int blamed = blamed_upstream_ >= 0 ? blamed_upstream_ : nb_.prev_rank;
  notice_sent_for_ = blamed;
  if (!ctrl_next_.valid()) return;
  FrameHeader h;
  h.kind = static_cast<std::uint8_t>(CollectiveKind::kStallNotice);
  h.root = blamed;
  h.seq = seq;
  common::write_exact(ctrl_next_.fd(), &h, kHeader, common::deadline_after(0.5));
}

void TcpRingChannel::send_abort(int failed_rank, const std::string& reason,
                                AbortCause cause) noexcept {
  if (abort_sent_) return;
  abort_sent_ = true;
  FrameHeader h;
  h.kind = static_cast<std::uint8_t>(CollectiveKind::kAbort);
  h.root = failed_rank;
  h.op = static_cast<std::uint8_t>(cause);
  std::string text = reason.substr(0, kMaxAbortReasonBytes);
  h.payload_bytes = text.size();
  for (common::Socket* s : {&ctrl_next_, &ctrl_prev_}) {
    if (!s->valid()) continue;
    common::Deadline d = common::deadline_after(1.0);
    if (common::write_exact(s->fd(), &h, kHeader, d).status == common::IoStatus::kOk) {
      common::write_exact(s->fd(), text.data(), text.size(), d);
    }
  }
}

}  // namespace mwms::collective
