// Stall blame (Note [stall blame]): "I wait for p in seq S" notices, and the chain a timing-out
// rank follows to name the rank that actually stalled.
#include "collective/engine/control_plane.h"

#include <mutex>

#include "common/socket.h"

namespace mwms::collective {

namespace {
constexpr std::size_t kHeader = sizeof(FrameHeader);
}  // namespace

// Note [stall blame]: the sender waits for `waited_for`, or (-1) no longer waits. Only a rank's
// own notice moves its edge; an out-of-range rank is ignored (the edge stays as it was).
void ControlPlane::record_stall(int peer, const FrameHeader& h) {
  const StallFrame f = stall_frame_of(h);
  const int waiter = f.waiter;
  const int waited = f.waited_for;
  if (waiter == peer && waited >= -1 && waited < static_cast<int>(waits_for_.size())) {
    waits_for_[static_cast<std::size_t>(waiter)] = waited;
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

}  // namespace mwms::collective
