// The control plane's core (engine/control_plane.h): the links, peer names, the poll that reads
// every control frame and the dispatch to each protocol's file (Note [control frames]):
// control_ready.cc, control_abort.cc, control_stall.cc, control_finalize.cc, control_heartbeat.cc.
#include "collective/engine/control_plane.h"

#include <algorithm>

#include "common/socket.h"
#include "mwms/errors.h"

namespace mwms::collective {

namespace {
constexpr std::size_t kHeader = sizeof(FrameHeader);
}  // namespace

ControlPlane::ControlPlane(int rank, std::vector<common::Socket> links, PeerNames names)
    : rank_(rank),
      links_(std::move(links)),
      open_(new std::atomic<bool>[links_.size()]),  // senders on other threads read them
      names_(std::move(names)),
      fds_(static_cast<std::size_t>(kMaxExtra) + links_.size()),
      fd_peer_(fds_.size(), -1),
      waits_for_(links_.size(), -1),
      finalized_after_(links_.size(), -1),
      peer_interval_(links_.size(), -1),
      heard_(links_.size(), common::Clock::now()),
      polled_(common::Clock::now()),
      heartbeat_off_(links_.size(), false),
      process_checked_(links_.size(), common::Clock::time_point()),
      gone_(links_.size(), false) {
  // This rank's own slot has no link: closed from the start, so every loop over peers skips it.
  for (std::size_t p = 0; p < links_.size(); ++p) open_[p].store(links_[p].valid());
}

ControlPlane::~ControlPlane() { stop_heartbeat(); }

std::string ControlPlane::name_of(int peer) const {
  std::string out = "rank " + std::to_string(peer);
  if (peer >= 0 && peer < static_cast<int>(names_.addresses.size())) {
    out += " (" + names_.tasks[static_cast<std::size_t>(peer)] + ", " +
           names_.addresses[static_cast<std::size_t>(peer)] + ")";
  }
  return out;
}

ErrorContext ControlPlane::with_peer(ErrorContext ctx, int peer) const {
  ctx.peer_rank = peer;
  if (peer >= 0 && peer < static_cast<int>(names_.addresses.size())) {
    ctx.peer_address = names_.addresses[static_cast<std::size_t>(peer)];
    ctx.peer_task = names_.tasks[static_cast<std::size_t>(peer)];
  }
  return ctx;
}

bool ControlPlane::poll(const pollfd* extra, int n_extra, int timeout_ms,
                        const ErrorContext& ctx) {
  int k = 0;
  for (int i = 0; i < n_extra && i < kMaxExtra; ++i) {  // fds_ has room for kMaxExtra
    fds_[static_cast<std::size_t>(k)] = extra[i];
    fd_peer_[static_cast<std::size_t>(k++)] = -1;
  }
  for (std::size_t p = 0; p < links_.size(); ++p) {
    if (!open_[p]) continue;  // a socket at end of file would poll readable forever
    fds_[static_cast<std::size_t>(k)] = {links_[p].fd(), POLLIN, 0};
    fd_peer_[static_cast<std::size_t>(k++)] = static_cast<int>(p);
  }
  // One poll over the caller's descriptors and every open control link: data and control are
  // waited on together, so an abort wakes a rank blocked on a TCP data socket.
  int rc = ::poll(fds_.data(), static_cast<nfds_t>(k), timeout_ms);
  polled_ = common::Clock::now();  // Note [heartbeat]: silence counts up to here
  if (rc <= 0) return false;       // 0: timed out; -1 (EINTR): the caller polls again
  bool extra_ready = false;
  for (int i = 0; i < k; ++i) {
    const pollfd& f = fds_[static_cast<std::size_t>(i)];
    if (f.revents == 0) continue;
    int peer = fd_peer_[static_cast<std::size_t>(i)];
    if (peer < 0) {
      extra_ready = true;
    } else {
      read_message(peer, ctx);
    }
  }
  return extra_ready;
}

void ControlPlane::read_message(int peer, const ErrorContext& ctx) {
  const int fd = links_[static_cast<std::size_t>(peer)].fd();
  FrameHeader h;  // senders write each frame whole: 1 s bounds a cut one
  common::IoResult res = common::read_exact(fd, &h, kHeader, common::deadline_after(1.0));
  const bool framed = res.status == common::IoStatus::kOk && h.magic == kFrameMagic &&
                      h.version == kFrameVersion;
  if (framed) {
    heard_[static_cast<std::size_t>(peer)] = polled_;  // Note [heartbeat]: any frame is a sign
    ++messages_;
  }
  if (framed && h.kind == static_cast<std::uint8_t>(CollectiveKind::kHeartbeat)) {
    record_heartbeat(peer, h, ctx);
    return;
  }
  if (framed && h.kind == static_cast<std::uint8_t>(CollectiveKind::kStallNotice)) {
    record_stall(peer, h);
    return;
  }
  if (framed && h.kind == static_cast<std::uint8_t>(CollectiveKind::kFinalized)) {
    record_finalized(peer, h, ctx);
    return;
  }
  if (!framed || h.kind != static_cast<std::uint8_t>(CollectiveKind::kAbort)) {
    // A peer that exits closes its control link; that alone is not a failure (it may have
    // finished). The runner decides whether this peer's absence matters (it waits for it).
    open_[static_cast<std::size_t>(peer)].store(false);
    return;
  }
  record_abort(peer, h, ctx);
}

void ControlPlane::drain(int peer, const ErrorContext& ctx) {
  // An abort from any rank that is already here explains the failure better (the failing rank
  // tells everyone directly, and its victims may close their links before we read it).
  poll(nullptr, 0, 0, ctx);
  if (peer < 0 || peer >= static_cast<int>(links_.size()) || closed(peer)) return;
  pollfd p{links_[static_cast<std::size_t>(peer)].fd(), POLLIN, 0};
  if (::poll(&p, 1, 250) > 0) read_message(peer, ctx);
}

void ControlPlane::throw_failure(const ErrorContext& ctx) const {
  ErrorContext c = with_peer(ctx, failure_.peer);
  c.cause = failure_.why;
  const std::string text = failure_.text + " (noticed between collectives, before " + ctx.op +
                           " seq " + std::to_string(ctx.seq) + ")";
  if (failure_.cause == AbortCause::kMismatch) throw CollectiveMismatchError(text, c);
  if (failure_.cause == AbortCause::kTimeout) throw TimeoutError(text, c);
  throw PeerError(text, c);
}

}  // namespace mwms::collective
