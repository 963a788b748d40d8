// A link over two single-producer single-consumer byte rings in memory both ranks can reach: the
// shared-memory transport (rings in a segment mapped by both processes) and the in-memory test
// transport (rings on the heap, ranks as threads) are this one class over different memory.
//
// Note [ring link layout]: each message is a 64-byte envelope block (FrameHeader, zero padded)
// followed by its payload padded to a multiple of 64 bytes, so payloads start 64-byte aligned in
// the ring and, since the ring's capacity is a multiple of 64, a wrapped view ends on a multiple
// of 64 payload bytes (never inside an element). The receiver reads (and reduces) payload bytes
// where they lie when the plan allows it (RecvSlot::must_land false): one copy per byte moved,
// the sender's. Otherwise it copies them to the landing area as they arrive.
//
// Note [doorbell]: a rank that found nothing to do sleeps on its own doorbell (a futex word):
// it announces itself (sleepers), re-checks the rings, then waits for the doorbell's sequence to
// change. A peer that produced bytes into, or freed space in, a ring that rank uses bumps the
// sequence and wakes it when someone sleeps. The store/fence/load order on both sides means a
// wake-up is never lost; sleeps are also bounded by the runner (10 ms) so a dead peer is seen.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "collective/transport/link.h"

namespace mwms::collective {

/// Head/tail of one byte ring, on separate cache lines (no false sharing between the two ranks).
struct alignas(64) ByteRingControl {
  alignas(64) std::atomic<std::uint64_t> head{0};  // bytes ever produced
  alignas(64) std::atomic<std::uint64_t> tail{0};  // bytes ever consumed
};

/// A rank's futex word (Note [doorbell]).
struct alignas(64) Doorbell {
  std::atomic<std::uint32_t> seq{0};
  std::atomic<std::uint32_t> sleepers{0};
};

/// One direction: control block, data area of `capacity` bytes (a multiple of 64).
struct ByteRing {
  ByteRingControl* control = nullptr;
  char* data = nullptr;
  std::size_t capacity = 0;
};

class RingLink final : public Link {
 public:
  /// `tx` is the ring this rank writes (the peer reads), `rx` the one it reads; `own` is this
  /// rank's doorbell, `peer_bell` the peer's. All memory outlives the link.
  RingLink(int peer, TransportCaps caps, ByteRing tx, ByteRing rx, Doorbell* own,
           Doorbell* peer_bell);
  /// As above, with the two ranks' flat and staging areas (Note [flat slots], link.h; 64-byte
  /// aligned, outliving the link); flat.own_bell and flat.peer_bell are set to `own`, `peer_bell`.
  RingLink(int peer, TransportCaps caps, ByteRing tx, ByteRing rx, Doorbell* own,
           Doorbell* peer_bell, FlatSlots flat);

  const TransportCaps& caps() const noexcept override { return caps_; }
  int peer() const noexcept override { return peer_; }
  bool poll_send(SendSlot& slot) override;
  bool poll_recv(RecvSlot& slot) override;
  RecvView recv_view(const RecvSlot& slot) override;
  void recv_release(RecvSlot& slot, std::size_t bytes) override;
  void wait(double max_seconds, bool for_send, bool for_recv) override;
  Doorbell* doorbell() const noexcept override { return own_; }
  bool moved_since_poll(bool for_send, bool for_recv) const noexcept override;
  FlatSlots flat_slots() const noexcept override { return flat_; }
  bool peek_envelope(FrameHeader* out) const noexcept override;

 private:
  void ring_peer() noexcept;
  void publish_tail(std::uint64_t tail) noexcept;
  std::size_t payload_in_ring(const RecvSlot& slot) const noexcept;

  int peer_;
  TransportCaps caps_;
  ByteRing tx_;
  ByteRing rx_;
  Doorbell* own_;
  Doorbell* peer_bell_;
  FlatSlots flat_;
  std::uint64_t rx_next_ = 0;           // ring position where the next message's envelope starts
  std::uint64_t rx_payload_start_ = 0;  // ring position of the current payload's byte 0
  std::uint64_t rx_seen_head_ = 0;      // for wait(): what poll_recv last saw
  std::uint64_t tx_seen_tail_ = 0;      // the consumer's tail as last read (Note [lazy tail])
  std::uint64_t rx_published_tail_ = 0; // the tail the producer can see
};

/// Sleeps on `bell` until its sequence differs from `seen` or `max_seconds` pass (futex).
void doorbell_wait(Doorbell* bell, std::uint32_t seen, double max_seconds) noexcept;
/// Bumps `bell` and wakes its sleepers, if any (Note [doorbell]). Call right after a seq_cst
/// store of the head or tail the sleeper re-checks.
void doorbell_ring(Doorbell* bell) noexcept;

}  // namespace mwms::collective
