// The shared-memory link (DESIGN "The transport seam"): a RingLink (ring_link.h) whose rings and
// doorbells live in the segments of the two ranks (shm_segment.h). It holds both segments, so
// the mapped memory lives as long as the link, whatever happens to the transport that made it.
#pragma once

#include <memory>

#include "collective/transport/ring_link.h"
#include "collective/transport/shm/shm_segment.h"

namespace mwms::collective {

class ShmLink final : public Link {
 public:
  /// The link of rank `rank` to `peer`: it writes the ring of `peer_segment` indexed by `rank`
  /// and reads the ring of `own` indexed by `peer`.
  ShmLink(int rank, int peer, TransportCaps caps, std::shared_ptr<ShmSegment> own,
          std::shared_ptr<ShmSegment> peer_segment);

  const TransportCaps& caps() const noexcept override { return ring_.caps(); }
  int peer() const noexcept override { return ring_.peer(); }
  bool poll_send(SendSlot& slot) override { return ring_.poll_send(slot); }
  bool poll_recv(RecvSlot& slot) override { return ring_.poll_recv(slot); }
  RecvView recv_view(const RecvSlot& slot) override { return ring_.recv_view(slot); }
  void recv_release(RecvSlot& slot, std::size_t bytes) override { ring_.recv_release(slot, bytes); }
  void wait(double max_seconds, bool for_send, bool for_recv) override {
    ring_.wait(max_seconds, for_send, for_recv);
  }
  // Without these two a runner waiting on several shm links fell back to sleeping on the first
  // one alone (Note [doorbell]).
  Doorbell* doorbell() const noexcept override { return ring_.doorbell(); }
  bool moved_since_poll(bool for_send, bool for_recv) const noexcept override {
    return ring_.moved_since_poll(for_send, for_recv);
  }
  FlatSlots flat_slots() const noexcept override { return ring_.flat_slots(); }
  bool peek_envelope(FrameHeader* out) const noexcept override { return ring_.peek_envelope(out); }

 private:
  std::shared_ptr<ShmSegment> own_;
  std::shared_ptr<ShmSegment> peer_segment_;
  RingLink ring_;
};

}  // namespace mwms::collective
