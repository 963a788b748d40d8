// Liveness (Note [heartbeat], Note [dead process]): heartbeats, a peer lost to silence or to a
// vanished process, and the thread that looks between collectives.
#include "collective/engine/control_plane.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>

#include "bootstrap/peer_info.h"
#include "common/logging.h"
#include "common/socket.h"
#include "mwms/errors.h"

namespace mwms::collective {

namespace {
constexpr std::size_t kHeader = sizeof(FrameHeader);
double since(common::Clock::time_point a, common::Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}
}  // namespace

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
    const AbortCause cause =
        dynamic_cast<const CollectiveMismatchError*>(&e) != nullptr ? AbortCause::kMismatch
        : dynamic_cast<const TimeoutError*>(&e) != nullptr          ? AbortCause::kTimeout
                                                                    : AbortCause::kPeer;
    note_failure(e.message(), cause, e.context().cause, e.context().peer_rank,
                 "between collectives");
    return;
  } catch (...) {
    return;  // std::bad_alloc building a message: the next collective's own waits see it
  }
  for (int p = 0; p < static_cast<int>(links_.size()); ++p) {
    try {
      if (!closed(p) && process_gone(p)) {  // Note [dead process]
        note_failure(gone_reason(p), AbortCause::kPeer, FailureCause::kDied, p,
                     "between collectives");
        return;
      }
      if (!lost(p)) continue;
      note_failure(lost_reason(p), AbortCause::kPeer, FailureCause::kStalled, p, "heartbeat");
    } catch (...) {  // std::bad_alloc building the reason: the next collective's waits see it
    }
    return;
  }
}

// Records the first failure found between collectives for the next collective to throw
// (throw_failure), and says so in the log.
void ControlPlane::note_failure(std::string text, AbortCause cause, FailureCause why, int peer,
                                const char* where) noexcept {
  failure_.text = std::move(text);
  failure_.cause = cause;
  failure_.why = why;
  failure_.peer = peer;
  failure_.set = true;
  try {
    MWMS_LOG_WARN(kColl, where << ": " << failure_.text
                               << "; the next collective of this rank will fail");
  } catch (...) {  // a log line that cannot be written changes nothing
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

}  // namespace mwms::collective
