#include "collective/transport/shm/shm_link.h"

#include <utility>

namespace mwms::collective {

ShmLink::ShmLink(int rank, int peer, TransportCaps caps, std::shared_ptr<ShmSegment> own,
                 std::shared_ptr<ShmSegment> peer_segment)
    : own_(std::move(own)),
      peer_segment_(std::move(peer_segment)),
      ring_(peer, caps, peer_segment_->inbound(rank), own_->inbound(peer), own_->doorbell(),
            peer_segment_->doorbell()) {}

}  // namespace mwms::collective
