// The finalized notice (Note [finalize]): how many collectives a rank completed before it closed
// its links, checked field by field before it is believed.
#include "collective/engine/control_plane.h"

#include <mutex>
#include <string>

#include "common/logging.h"
#include "common/socket.h"
#include "mwms/errors.h"

namespace mwms::collective {

namespace {
constexpr std::size_t kHeader = sizeof(FrameHeader);
}  // namespace

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

}  // namespace mwms::collective
