// The abort relay (Note [abort relay], Note [local abort]): a failing rank tells every rank, the
// first rank to read it forwards it once, and every rank re-raises the class the failing rank saw.
#include "collective/engine/control_plane.h"

#include <algorithm>
#include <mutex>
#include <string>

#include "common/socket.h"
#include "mwms/errors.h"

namespace mwms::collective {

namespace {
constexpr std::size_t kHeader = sizeof(FrameHeader);
}  // namespace

// An abort frame from `peer` (its reason follows the header): relayed once (Note [abort relay]),
// then thrown as the class the failing rank saw.
void ControlPlane::record_abort(int peer, const FrameHeader& h, const ErrorContext& ctx) {
  const int fd = links_[static_cast<std::size_t>(peer)].fd();
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

}  // namespace mwms::collective
