#include "collective/engine/control_plane.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>

#include "bootstrap/peer_info.h"
#include "common/logging.h"

namespace mwms::collective {

namespace {
constexpr std::size_t kHeader = sizeof(FrameHeader);
double since(common::Clock::time_point a, common::Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}
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

void ControlPlane::ready_barrier(common::Deadline deadline, const ErrorContext& ctx) {
  const FrameHeader ready = encode(ReadyFrame{rank_});  // Note [control frames]
  // Every write before any read: were the reads first, all ranks would wait for each other.
  for (std::size_t p = 0; p < links_.size(); ++p) {
    if (links_[p].valid()) common::write_exact(links_[p].fd(), &ready, kHeader, deadline);
  }
  for (std::size_t p = 0; p < links_.size(); ++p) {
    if (!links_[p].valid()) continue;
    FrameHeader h;
    common::IoResult r = common::read_exact(links_[p].fd(), &h, kHeader, deadline);
    bool ok = r.status == common::IoStatus::kOk && is_ready_frame(h) &&
              ready_frame_of(h).sender == static_cast<int>(p);
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
  for (int i = 0; i < n_extra && i < kMaxExtra; ++i) {  // fds_ has room for kMaxExtra
    fds_[static_cast<std::size_t>(k)] = extra[i];
    fd_peer_[static_cast<std::size_t>(k++)] = -1;
  }
  for (std::size_t p = 0; p < links_.size(); ++p) {
    if (!open_[p]) continue;  // a socket at end of file would poll readable forever
    fds_[static_cast<std::size_t>(k)] = {links_[p].fd(), POLLIN, 0};
    fd_peer_[static_cast<std::size_t>(k++)] = static_cast<int>(p);
  }
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
    // Note [stall blame]: the sender waits for `root`, or (root -1) no longer waits. Only a
    // rank's own notice moves its edge.
    const StallFrame f = stall_frame_of(h);
    const int waiter = f.waiter;
    const int waited = f.waited_for;
    if (waiter == peer && waited >= -1 && waited < static_cast<int>(waits_for_.size())) {
      waits_for_[static_cast<std::size_t>(waiter)] = waited;
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
    open_[static_cast<std::size_t>(peer)].store(false);
    return;
  }
  AbortFrame abort = abort_frame_of(h);
  std::string reason(std::min<std::uint64_t>(abort.reason_bytes, kMaxAbortReasonBytes), '\0');
  common::read_exact(fd, reason.data(), reason.size(), common::deadline_after(1.0));
  // A failed rank outside the communicator is the sender's own failure.
  const int failed = abort.failed_rank >= 0 && abort.failed_rank < static_cast<int>(links_.size())
                         ? abort.failed_rank
                         : peer;
  // Note [abort relay]: the failing rank tells every rank itself (full mesh), but one frame at a
  // time: a rank that reads it first may fail its collective and exit, closing its links, before
  // the failing rank's frame has reached a third rank (descheduled between two writes, on 2
  // cores), and that rank would then blame the closed link ("rank 0 closed the connection")
  // instead of the cause. So the first abort a rank reads is forwarded at once, unchanged, to
  // every other open peer, before this rank can close anything: on each control link the
  // forwarded frame is ahead of this rank's close, and drain() reads it first. One relay per
  // rank and communicator (abort_sent_), so a failure costs at most n^2 small frames.
  if (!abort_sent_.exchange(true)) {
    abort.reason_bytes = reason.size();  // what this rank read (at most kMaxAbortReasonBytes)
    const FrameHeader relay = encode(abort);
    std::lock_guard<std::mutex> lock(writer_);         // frames never interleave
    common::Deadline d = common::deadline_after(0.5);  // a peer that reads nothing cannot hold us
    for (std::size_t p = 0; p < links_.size(); ++p) {
      const int q = static_cast<int>(p);
      if (q == peer || q == failed || q == rank_ || closed(q)) continue;
      int out = links_[p].fd();
      if (common::write_exact(out, &relay, kHeader, d).status == common::IoStatus::kOk) {
        common::write_exact(out, reason.data(), reason.size(), d);  // only behind a whole header
      }
    }
  }
  std::string text = "rank " + std::to_string(failed) + " failed: " + reason;
  if (failed == rank_) {
    // e.g. a rank that was stopped and resumed: the others timed out naming it.
    text = "rank " + std::to_string(peer) + " reported that this rank (" +
           std::to_string(rank_) + ") failed: " + reason;
  } else if (failed != peer) {
    text += " (reported by rank " + std::to_string(peer) + ")";
  }
  ErrorContext c = with_peer(ctx, failed);
  c.cause = abort.failure;  // the failing rank's FailureCause
  // Re-raise with the class the failing rank saw, so every rank can react the same way.
  if (abort.cause == AbortCause::kMismatch) throw CollectiveMismatchError(text, c);
  if (abort.cause == AbortCause::kTimeout) throw TimeoutError(text, c);
  throw PeerError(text, c);
}

void ControlPlane::drain(int peer, const ErrorContext& ctx) {
  // An abort from any rank that is already here explains the failure better (the failing rank
  // tells everyone directly, and its victims may close their links before we read it).
  poll(nullptr, 0, 0, ctx);
  if (peer < 0 || peer >= static_cast<int>(links_.size()) || closed(peer)) return;
  pollfd p{links_[static_cast<std::size_t>(peer)].fd(), POLLIN, 0};
  if (::poll(&p, 1, 250) > 0) read_message(peer, ctx);
}

void ControlPlane::send_abort(int failed_rank, const std::string& reason, AbortCause cause,
                              FailureCause why) noexcept {
  if (abort_sent_.exchange(true)) return;
  // Note [local abort]: a collective of this rank blocked on another thread (abort() is called
  // from a signal watcher, a watchdog, ...) stops at its next wait slice instead of waiting for
  // the peers or its deadline.
  try {
    gave_up_reason_ = reason;
  } catch (...) {  // bad_alloc: the flag still stops the waits
  }
  gave_up_.store(true, std::memory_order_release);  // publishes gave_up_reason_ with it
  // Capped as the receiver caps its read: longer, the rest would be read as the next frame.
  std::string text = reason.substr(0, kMaxAbortReasonBytes);
  const FrameHeader h = encode(AbortFrame{failed_rank, cause, why, text.size()});
  std::lock_guard<std::mutex> lock(writer_);
  common::Deadline d = common::deadline_after(1.0);
  for (std::size_t p = 0; p < links_.size(); ++p) {
    if (closed(static_cast<int>(p))) continue;
    int fd = links_[p].fd();
    if (common::write_exact(fd, &h, kHeader, d).status == common::IoStatus::kOk) {
      common::write_exact(fd, text.data(), text.size(), d);
    }
  }
}

void ControlPlane::send_stall_notice(std::uint64_t seq, int waited) noexcept {
  const FrameHeader h = encode(StallFrame{rank_, waited, seq});
  waits_for_[static_cast<std::size_t>(rank_)] = waited;
  std::lock_guard<std::mutex> lock(writer_);
  common::Deadline d = common::deadline_after(0.5);
  for (std::size_t p = 0; p < links_.size(); ++p) {
    if (!closed(static_cast<int>(p))) common::write_exact(links_[p].fd(), &h, kHeader, d);
  }
}

void ControlPlane::record_finalized(int peer, const FrameHeader& h, const ErrorContext& ctx) {
  // Note [finalize]: a fixed-size frame; every field is checked before it is believed.
  // Note [control frames]: the fields the protocol leaves unused must be 0 (raw header fields).
  const FinalizedFrame f = finalized_frame_of(h);
  const std::uint64_t payload = h.payload_bytes;  // packed fields: copy, never bind a reference
  const std::uint64_t seq = f.collectives;
  const char* bad = nullptr;
  if (f.sender != peer) bad = "root is not the sender";
  if (payload != 0) bad = "payload_bytes is not 0";
  if (h.step != 0) bad = "step is not 0";
  if (seq >= (std::uint64_t{1} << 62)) bad = "seq is out of range";  // kept as an int64_t below
  if (bad != nullptr) {
    throw PeerError("rank " + std::to_string(peer) + " sent a malformed finalized notice (" + bad +
                        ", root " + std::to_string(f.sender) + ", seq " + std::to_string(seq) +
                        "): corrupt control stream",
                    with_peer(ctx, peer));
  }
  auto& at = finalized_after_[static_cast<std::size_t>(peer)];
  if (at >= 0) return;  // sent once; a repeat changes nothing
  at = static_cast<std::int64_t>(seq);
  if (first_finalized_ < 0 || seq < first_finalized_seq_) {  // finalized_before() stays O(1)
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
  stop_heartbeat();  // no heartbeat follows the notice: the link closes right after it
  std::lock_guard<std::mutex> lock(writer_);
  if (finalized_sent_) return;
  finalized_sent_ = true;
  const FrameHeader h = encode(FinalizedFrame{rank_, collectives});
  common::Deadline d = common::deadline_after(1.0);
  for (std::size_t p = 0; p < links_.size(); ++p) {
    if (!closed(static_cast<int>(p))) common::write_exact(links_[p].fd(), &h, kHeader, d);
  }
}

int ControlPlane::blame(int waited) const {
  // Note [stall blame]: follow the current "waits for" edges, whatever collective each rank is
  // in; stop at a rank that waits for nobody (the one that stalled), at this rank, or when the
  // chain loops.
  int at = waited;
  for (std::size_t hops = 0; hops < waits_for_.size(); ++hops) {  // n hops: a cycle cannot spin
    if (at < 0 || at >= static_cast<int>(waits_for_.size())) break;
    int next = waits_for_[static_cast<std::size_t>(at)];
    if (next < 0 || next == rank_) break;
    at = next;
  }
  return at;
}

// ---- Note [heartbeat] ----

void ControlPlane::record_heartbeat(int peer, const FrameHeader& h, const ErrorContext& ctx) {
  const HeartbeatFrame f = heartbeat_frame_of(h);
  const std::uint64_t payload = h.payload_bytes;  // packed fields: copy, never bind a reference
  const std::uint64_t interval_ms = f.interval_ms;
  const char* bad = nullptr;
  if (f.sender != peer) bad = "root is not the sender";
  if (payload != 0) bad = "payload_bytes is not 0";
  if (interval_ms > 86400000) bad = "interval is over a day";  // senders cap theirs at a day
  if (bad != nullptr) {
    throw PeerError("rank " + std::to_string(peer) + " sent a malformed heartbeat (" + bad +
                        ", root " + std::to_string(f.sender) + ", interval " +
                        std::to_string(interval_ms) + " ms): corrupt control stream",
                    with_peer(ctx, peer));
  }
  peer_interval_[static_cast<std::size_t>(peer)] = static_cast<double>(interval_ms) * 1e-3;
}

double ControlPlane::lost_after(int peer) const {
  if (interval_ <= 0 || peer < 0 || peer >= static_cast<int>(links_.size())) return 0;
  // Before its first heartbeat a peer is assumed to use our interval.
  const double theirs = peer_interval_[static_cast<std::size_t>(peer)];
  return kLostIntervals * std::max(interval_, theirs);
}

bool ControlPlane::lost(int peer) const {
  if (interval_ <= 0 || peer < 0 || peer >= static_cast<int>(links_.size()) || peer == rank_ ||
      closed(peer) || finalized_after_[static_cast<std::size_t>(peer)] >= 0 ||
      peer_interval_[static_cast<std::size_t>(peer)] == 0) {
    return false;  // its first heartbeat said 0: it sends none, so its silence means nothing
  }
  return since(heard_[static_cast<std::size_t>(peer)], polled_) > lost_after(peer);
}

double ControlPlane::silent_seconds(int peer) const {
  if (interval_ <= 0 || peer < 0 || peer >= static_cast<int>(links_.size())) return -1;
  return since(heard_[static_cast<std::size_t>(peer)], polled_);
}

bool ControlPlane::process_gone(int peer) {
  const std::size_t p = static_cast<std::size_t>(peer);
  if (peer < 0 || peer == rank_ || p >= links_.size() || p >= names_.processes.size() ||
      names_.processes[p].empty() || finalized_after_[p] >= 0) {
    return false;
  }
  if (gone_[p]) return true;
  if (closed(peer)) return false;  // the close (and a finalize before it) tells more
  const auto now = common::Clock::now();
  if (since(process_checked_[p], now) < kProcessCheckSeconds) return false;
  process_checked_[p] = now;
  // Only a link with nothing to read and no end-of-file is held open by someone else: a peer
  // that exited normally left its finalized notice or its close to be read first.
  char byte;
  const ssize_t n = ::recv(links_[p].fd(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) return false;
  gone_[p] = bootstrap::process_gone(names_.processes[p]);
  return gone_[p];
}

std::string ControlPlane::gone_reason(int peer) const {
  const std::string& id = names_.processes[static_cast<std::size_t>(peer)];
  const std::size_t a = id.find(':');
  const std::string pid = id.substr(a + 1, id.find(':', a + 1) - a - 1);
  return name_of(peer) + " died: its process (pid " + pid + " on this host) no longer exists" +
         (closed(peer) ? std::string()
                       : ", though its connections are still open (held by a process it "
                         "forked?)");
}

void ControlPlane::send_heartbeats(std::uint64_t interval_ms) noexcept {
  const FrameHeader h = encode(HeartbeatFrame{rank_, interval_ms});
  std::lock_guard<std::mutex> lock(writer_);
  if (finalized_sent_) return;  // nothing may follow the finalized notice
  for (std::size_t p = 0; p < links_.size(); ++p) {
    if (closed(static_cast<int>(p)) || heartbeat_off_[p]) continue;
    // A peer that reads nothing for hours fills its buffer: a frame that cannot go out whole
    // might go out in part, so that link gets no more heartbeats (its silence is the peer's).
    common::IoResult r =
        common::write_exact(links_[p].fd(), &h, kHeader, common::deadline_after(0.5));
    if (r.status != common::IoStatus::kOk) heartbeat_off_[p] = true;
  }
}

void ControlPlane::start_heartbeat(double interval_seconds, const ErrorContext& base) noexcept {
  base_ = base;
  const double ms = std::max(0.0, std::min(interval_seconds, 86400.0)) * 1000.0;
  // Every peer learns our interval first (0: expect nothing, Note [heartbeat]).
  send_heartbeats(static_cast<std::uint64_t>(ms));
  if (interval_seconds <= 0 || links_.size() < 2) return;  // a world of one watches nobody
  {
    std::lock_guard<ReaderLock> lock(reader_);
    interval_ = interval_seconds;
    polled_ = common::Clock::now();
    std::fill(heard_.begin(), heard_.end(), polled_);  // start-up time is no silence
  }
  try {
    thread_ = std::thread([this] { heartbeat_loop(); });
  } catch (const std::exception& e) {
    std::lock_guard<ReaderLock> lock(reader_);
    interval_ = 0;  // lost() is never true without the thread
    MWMS_LOG_WARN(kColl, "cannot start the heartbeat thread (" << e.what()
                             << "): frozen peers are noticed by the op timeout only");
  }
}

void ControlPlane::stop_heartbeat() noexcept {
  {
    std::lock_guard<std::mutex> lock(stop_mutex_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

// STYLE item 15: nothing escapes; what goes wrong is recorded for the next collective.
void ControlPlane::heartbeat_loop() noexcept {
  const auto interval = std::chrono::duration<double>(interval_);
  const auto ms = static_cast<std::uint64_t>(interval_ * 1000.0);
  std::unique_lock<std::mutex> lock(stop_mutex_);
  while (!stop_cv_.wait_for(lock, interval, [&] { return stop_; })) {
    lock.unlock();  // stop_heartbeat() must not wait for our writes
    send_heartbeats(ms);
    // The engine holds reader_ for a whole collective and reads the links itself: never wait.
    if (reader_.try_lock()) {
      std::lock_guard<ReaderLock> held(reader_, std::adopt_lock);
      check_between_collectives();
    }
    lock.lock();
  }
}

void ControlPlane::check_between_collectives() noexcept {
  if (failure_.set) return;  // the first failure found is the one the next collective throws
  try {
    // Everything that arrived since the last poll (one frame per link per poll), bounded.
    for (int round = 0; round < 64; ++round) {
      const std::uint64_t before = messages_;
      poll(nullptr, 0, 0, base_);
      if (messages_ == before) break;
    }
  } catch (const Error& e) {
    // An abort (or a malformed frame) between collectives: the next collective throws it.
    failure_.cause = dynamic_cast<const CollectiveMismatchError*>(&e) != nullptr
                         ? AbortCause::kMismatch
                         : dynamic_cast<const TimeoutError*>(&e) != nullptr ? AbortCause::kTimeout
                                                                            : AbortCause::kPeer;
    failure_.why = e.context().cause;
    failure_.peer = e.context().peer_rank;
    failure_.text = e.message();
    failure_.set = true;
    MWMS_LOG_WARN(kColl, "between collectives: " << failure_.text
                                                 << "; the next collective of this rank will fail");
    return;
  } catch (...) {
    return;  // std::bad_alloc building a message: the next collective's own waits see it
  }
  for (int p = 0; p < static_cast<int>(links_.size()); ++p) {
    if (!closed(p) && process_gone(p)) {  // Note [dead process]
      try {
        failure_.text = gone_reason(p);
        failure_.cause = AbortCause::kPeer;
        failure_.why = FailureCause::kDied;
        failure_.peer = p;
        failure_.set = true;
        MWMS_LOG_WARN(kColl, "between collectives: " << failure_.text
                                                     << "; the next collective of this rank will fail");
      } catch (...) {
      }
      return;
    }
    if (!lost(p)) continue;
    try {
      failure_.text = lost_reason(p);
      failure_.cause = AbortCause::kPeer;
      failure_.why = FailureCause::kStalled;
      failure_.peer = p;
      failure_.set = true;
      MWMS_LOG_WARN(kColl, "heartbeat: " << failure_.text
                                         << "; the next collective of this rank will fail");
    } catch (...) {
    }
    return;
  }
}

std::string ControlPlane::lost_reason(int peer) const {
  char secs[96];
  std::snprintf(secs, sizeof secs, " for %.1f s (lost after %.1f s without a heartbeat, ",
                silent_seconds(peer), lost_after(peer));
  return name_of(peer) + " sent nothing on its control connection" + secs +
         "MWMS_HEARTBEAT_SECONDS): its process is stopped (SIGSTOP, a debugger) or hung, its "
         "host is down, or the network to it is cut";
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
