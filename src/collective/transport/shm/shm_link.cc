#include "collective/transport/shm/shm_link.h"

#include <utility>

namespace mwms::collective {

ShmLink::ShmLink(int rank, int peer, TransportCaps caps, std::shared_ptr<ShmSegment> own,
                 std::shared_ptr<ShmSegment> peer_segment)
    // The segments are members declared before ring_, so they are mapped before the ring's
    // pointers into them are taken and unmapped only after the ring is gone.
    : own_(std::move(own)),
      peer_segment_(std::move(peer_segment)),
      // tx: the peer's inbound ring for this rank (we are its only producer); rx: ours from the
      // peer. We sleep on our own doorbell and ring the peer's (Note [doorbell], ring_link.h).
      ring_(peer, caps, peer_segment_->inbound(rank), own_->inbound(peer), own_->doorbell(),
            peer_segment_->doorbell(),
            FlatSlots{own_->flat_area(), peer_segment_->flat_area(), own_->stage_area(),
                      peer_segment_->stage_area()}) {}

}  // namespace mwms::collective
