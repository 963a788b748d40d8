#include "collective/engine/control_plane.h"

#include <algorithm>

#include "common/logging.h"

namespace mwms::collective {

namespace {
constexpr std::size_t kHeader = sizeof(FrameHeader);
}  // namespace

ControlPlane::ControlPlane(int rank, std::vector<common::Socket> links, PeerNames names)
    : rank_(rank),
      links_(std::move(links)),
      open_(links_.size(), true),
      names_(std::move(names)),
      fds_(static_cast<std::size_t>(kMaxExtra) + links_.size()),
      fd_peer_(fds_.size(), -1),
      waits_for_(links_.size(), -1),
      waits_seq_(links_.size(), 0),
      finalized_after_(links_.size(), -1) {
  for (std::size_t p = 0; p < links_.size(); ++p) open_[p] = links_[p].valid();
}

ErrorContext ControlPlane::with_peer(ErrorContext ctx, int peer) const {
  ctx.peer_rank = peer;
  if (peer >= 0 && peer < static_cast<int>(names_.addresses.size())) {
    ctx.peer_address = names_.addresses[static_cast<std::size_t>(peer)];
    ctx.peer_task = names_.tasks[static_cast<std::size_t>(peer)];
  }
  return ctx;
}

void ControlPlane::ready_barrier(common::Deadline deadline, const ErrorContext& ctx) {
  FrameHeader ready;
  ready.kind = static_cast<std::uint8_t>(CollectiveKind::kBarrier);
  ready.seq = ~std::uint64_t{0};  // no collective has this number
  ready.root = rank_;
  for (std::size_t p = 0; p < links_.size(); ++p) {
    if (links_[p].valid()) common::write_exact(links_[p].fd(), &ready, kHeader, deadline);
  }
  for (std::size_t p = 0; p < links_.size(); ++p) {
    if (!links_[p].valid()) continue;
    FrameHeader h;
    common::IoResult r = common::read_exact(links_[p].fd(), &h, kHeader, deadline);
    bool ok = r.status == common::IoStatus::kOk && h.magic == kFrameMagic &&
              h.kind == static_cast<std::uint8_t>(CollectiveKind::kBarrier) &&
              h.seq == ~std::uint64_t{0} && h.root == static_cast<int>(p);
    if (!ok) {
      ErrorContext c = with_peer(ctx, static_cast<int>(p));
      throw BootstrapError("rank " + std::to_string(p) + " did not confirm its links at the end "
                           "of start-up (" + (r.status == common::IoStatus::kOk
                                                  ? std::string("unexpected message")
                                                  : r.describe()) +
                           "); it probably failed or exited during start-up", c);
    }
  }
}

bool ControlPlane::poll(const pollfd* extra, int n_extra, int timeout_ms,
                        const ErrorContext& ctx) {
  int k = 0;
  for (int i = 0; i < n_extra && i < kMaxExtra; ++i) {
    fds_[static_cast<std::size_t>(k)] = extra[i];
    fd_peer_[static_cast<std::size_t>(k++)] = -1;
  }
  for (std::size_t p = 0; p < links_.size(); ++p) {
    if (!open_[p]) continue;
    fds_[static_cast<std::size_t>(k)] = {links_[p].fd(), POLLIN, 0};
    fd_peer_[static_cast<std::size_t>(k++)] = static_cast<int>(p);
  }
  int rc = ::poll(fds_.data(), static_cast<nfds_t>(k), timeout_ms);
  if (rc <= 0) return false;
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
  FrameHeader h;
  common::IoResult res = common::read_exact(fd, &h, kHeader, common::deadline_after(1.0));
  const bool framed = res.status == common::IoStatus::kOk && h.magic == kFrameMagic &&
                      h.version == kFrameVersion;
  if (framed && h.kind == static_cast<std::uint8_t>(CollectiveKind::kStallNotice)) {
    int waiter = h.step;
    int waited = h.root;
    if (waiter >= 0 && waiter < static_cast<int>(waits_for_.size()) && waited >= 0 &&
        waited < static_cast<int>(waits_for_.size())) {
      waits_for_[static_cast<std::size_t>(waiter)] = waited;
      waits_seq_[static_cast<std::size_t>(waiter)] = h.seq;
    }
    return;
  }
  if (framed && h.kind == static_cast<std::uint8_t>(CollectiveKind::kFinalized)) {
    record_finalized(peer, h, ctx);
    return;
  }
  if (!framed || h.kind != static_cast<std::uint8_t>(CollectiveKind::kAbort)) {
    // A peer that exits closes its control link; that alone is not a failure (it may have
    // finished). The runner decides whether this peer's absence matters (it waits for it).
    open_[static_cast<std::size_t>(peer)] = false;
    return;
  }
  const std::uint64_t payload = h.payload_bytes;  // packed field: copy, never bind a reference
  std::string reason(std::min<std::uint64_t>(payload, kMaxAbortReasonBytes), '\0');
  common::read_exact(fd, reason.data(), reason.size(), common::deadline_after(1.0));
  int failed = h.root >= 0 && h.root < static_cast<int>(links_.size()) ? h.root : peer;
  // The failing rank told every rank itself (full mesh): nothing to relay.
  abort_sent_ = true;
  std::string text = "rank " + std::to_string(failed) + " failed: " + reason;
  if (failed == rank_) {
    // e.g. a rank that was stopped and resumed: the others timed out naming it.
    text = "rank " + std::to_string(peer) + " reported that this rank (" +
           std::to_string(rank_) + ") failed: " + reason;
  } else if (failed != peer) {
    text += " (reported by rank " + std::to_string(peer) + ")";
  }
  ErrorContext c = with_peer(ctx, failed);
  // Re-raise with the class the failing rank saw, so every rank can react the same way.
  if (h.op == static_cast<std::uint8_t>(AbortCause::kMismatch)) {
    throw CollectiveMismatchError(text, c);
  }
  if (h.op == static_cast<std::uint8_t>(AbortCause::kTimeout)) throw TimeoutError(text, c);
  throw PeerError(text, c);
}

void ControlPlane::drain(int peer, const ErrorContext& ctx) {
  // An abort from any rank that is already here explains the failure better (the failing rank
  // tells everyone directly, and its victims may close their links before we read it).
  poll(nullptr, 0, 0, ctx);
  if (peer < 0 || peer >= static_cast<int>(links_.size()) || !open_[static_cast<std::size_t>(peer)]) {
    return;
  }
  pollfd p{links_[static_cast<std::size_t>(peer)].fd(), POLLIN, 0};
  if (::poll(&p, 1, 250) > 0) read_message(peer, ctx);
}

void ControlPlane::send_abort(int failed_rank, const std::string& reason,
                              AbortCause cause) noexcept {
  if (abort_sent_) return;
  abort_sent_ = true;
  FrameHeader h;
  h.kind = static_cast<std::uint8_t>(CollectiveKind::kAbort);
  h.root = failed_rank;
  h.op = static_cast<std::uint8_t>(cause);
  std::string text = reason.substr(0, kMaxAbortReasonBytes);
  h.payload_bytes = text.size();
  common::Deadline d = common::deadline_after(1.0);
  for (std::size_t p = 0; p < links_.size(); ++p) {
    if (!open_[p]) continue;
    int fd = links_[p].fd();
    if (common::write_exact(fd, &h, kHeader, d).status == common::IoStatus::kOk) {
      common::write_exact(fd, text.data(), text.size(), d);
    }
  }
}

void ControlPlane::send_stall_notice(std::uint64_t seq, int waited) noexcept {
  FrameHeader h;
  h.kind = static_cast<std::uint8_t>(CollectiveKind::kStallNotice);
  h.root = waited;
  h.step = rank_;
  h.seq = seq;
  waits_for_[static_cast<std::size_t>(rank_)] = waited;
  waits_seq_[static_cast<std::size_t>(rank_)] = seq;
  common::Deadline d = common::deadline_after(0.5);
  for (std::size_t p = 0; p < links_.size(); ++p) {
    if (open_[p]) common::write_exact(links_[p].fd(), &h, kHeader, d);
  }
}

void ControlPlane::record_finalized(int peer, const FrameHeader& h, const ErrorContext& ctx) {
  // Note [finalize]: a fixed-size frame; every field is checked before it is believed.
  const std::uint64_t payload = h.payload_bytes;  // packed fields: copy, never bind a reference
  const std::uint64_t seq = h.seq;
  const char* bad = nullptr;
  if (h.root != peer) bad = "root is not the sender";
  if (payload != 0) bad = "payload_bytes is not 0";
  if (h.step != 0) bad = "step is not 0";
  if (seq >= (std::uint64_t{1} << 62)) bad = "seq is out of range";
  if (bad != nullptr) {
    throw PeerError("rank " + std::to_string(peer) + " sent a malformed finalized notice (" + bad +
                        ", root " + std::to_string(h.root) + ", seq " + std::to_string(seq) +
                        "): corrupt control stream",
                    with_peer(ctx, peer));
  }
  auto& at = finalized_after_[static_cast<std::size_t>(peer)];
  if (at >= 0) return;  // sent once; a repeat changes nothing
  at = static_cast<std::int64_t>(seq);
  if (first_finalized_ < 0 || seq < first_finalized_seq_) {
    first_finalized_ = peer;
    first_finalized_seq_ = seq;
  }
  MWMS_LOG_DEBUG(kColl, "rank " << peer << " finalized after " << seq << " collective(s)");
}

std::int64_t ControlPlane::finalized_after(int peer) const {
  if (peer < 0 || peer >= static_cast<int>(finalized_after_.size())) return -1;
  return finalized_after_[static_cast<std::size_t>(peer)];
}

void ControlPlane::send_finalized(std::uint64_t collectives) noexcept {
  if (finalized_sent_) return;
  finalized_sent_ = true;
  FrameHeader h;
  h.kind = static_cast<std::uint8_t>(CollectiveKind::kFinalized);
  h.root = rank_;
  h.seq = collectives;
  common::Deadline d = common::deadline_after(1.0);
  for (std::size_t p = 0; p < links_.size(); ++p) {
    if (open_[p]) common::write_exact(links_[p].fd(), &h, kHeader, d);
  }
}

int ControlPlane::blame(std::uint64_t seq, int waited) const {
  // Note [stall blame]: follow "waits for" edges of this collective; stop at a rank that waits
  // for nobody (the one that stalled) or when the chain loops.
  int at = waited;
  for (std::size_t hops = 0; hops < waits_for_.size(); ++hops) {
    if (at < 0 || at >= static_cast<int>(waits_for_.size())) break;
    int next = waits_for_[static_cast<std::size_t>(at)];
    if (next < 0 || waits_seq_[static_cast<std::size_t>(at)] != seq || next == rank_) break;
    at = next;
  }
  return at;
}

}  // namespace mwms::collective
