// The ready barrier at the end of start-up: every rank confirms its links on every control
// connection before the first collective (Note [control frames]).
#include "collective/engine/control_plane.h"

#include "common/socket.h"
#include "mwms/errors.h"

namespace mwms::collective {

namespace {
constexpr std::size_t kHeader = sizeof(FrameHeader);
}  // namespace

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

}  // namespace mwms::collective
