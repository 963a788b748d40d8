#include "collective/transport/ring_link.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <ctime>

#include "kernels/copy.h"

namespace mwms::collective {

namespace {
constexpr std::size_t kHeader = sizeof(FrameHeader);
constexpr std::uint64_t kBlock = 64;  // Note [ring link layout]
std::uint64_t round_up(std::uint64_t n) { return (n + kBlock - 1) / kBlock * kBlock; }
}  // namespace

void doorbell_wait(Doorbell* bell, std::uint32_t seen, double max_seconds) noexcept {
  if (max_seconds <= 0) return;
  timespec ts;
  ts.tv_sec = static_cast<time_t>(max_seconds);
  ts.tv_nsec = static_cast<long>((max_seconds - static_cast<double>(ts.tv_sec)) * 1e9);
  // Not FUTEX_PRIVATE: the word may live in memory shared between processes. The kernel sleeps
  // only while seq still equals `seen`, so a ring since the caller read `seen` returns at once.
  // The result is ignored: a wake, EAGAIN, EINTR and the timeout all mean "poll the rings".
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&bell->seq), FUTEX_WAIT, seen, &ts,
            nullptr, 0);
}

void doorbell_ring(Doorbell* bell) noexcept {
  // Note [doorbell]: the caller's store was seq_cst (an xchg on x86, cheaper than a separate
  // mfence), so this load cannot pass it; seq_cst too, which is what the C++ model needs of
  // the load in this store-then-load pattern (a plain mov on x86, a fence elsewhere).
  if (bell->sleepers.load(std::memory_order_seq_cst) == 0) return;
  // Release: a sleeper that reads the new seq also sees the head or tail stored before it.
  bell->seq.fetch_add(1, std::memory_order_release);
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&bell->seq), FUTEX_WAKE, INT_MAX,
            nullptr, nullptr, 0);
}

RingLink::RingLink(int peer, TransportCaps caps, ByteRing tx, ByteRing rx, Doorbell* own,
                   Doorbell* peer_bell)
    : peer_(peer), caps_(caps), tx_(tx), rx_(rx), own_(own), peer_bell_(peer_bell) {
  rx_next_ = rx_.control->tail.load(std::memory_order_relaxed);
  rx_published_tail_ = rx_next_;
  tx_seen_tail_ = tx_.control->tail.load(std::memory_order_relaxed);
}

RingLink::RingLink(int peer, TransportCaps caps, ByteRing tx, ByteRing rx, Doorbell* own,
                   Doorbell* peer_bell, FlatSlots flat)
    : RingLink(peer, caps, tx, rx, own, peer_bell) {
  flat_ = flat;
  flat_.own_bell = own;
  flat_.peer_bell = peer_bell;
}

void RingLink::ring_peer() noexcept { doorbell_ring(peer_bell_); }

bool RingLink::peek_envelope(FrameHeader* out) const noexcept {
  // As poll_recv() reads an envelope, minus every change: rx_next_ stays where it is.
  const std::uint64_t head = rx_.control->head.load(std::memory_order_acquire);
  if (head < rx_next_ || head - rx_next_ < kBlock) return false;
  std::memcpy(out, rx_.data + rx_next_ % rx_.capacity, kHeader);
  return true;
}

bool RingLink::poll_send(SendSlot& slot) {
  if (slot.done) return false;
  // Relaxed: this rank is the ring's only producer, so head is its own last store.
  std::uint64_t head = tx_.control->head.load(std::memory_order_relaxed);
  // Note [lazy tail]: the consumer's tail lives on a line the consumer writes; read it only when
  // the space seen last time does not suffice for what is to be sent now.
  const std::uint64_t want = (slot.header_sent < kHeader ? kBlock : 0) + (slot.ready - slot.sent) +
                             (slot.ready == slot.bytes ? round_up(slot.bytes) - slot.bytes : 0);
  if (tx_.capacity - (head - tx_seen_tail_) < std::max<std::uint64_t>(want, 1)) {
    // Acquire, against publish_tail()'s store: the consumer is done reading the bytes it freed
    // before this rank overwrites them.
    tx_seen_tail_ = tx_.control->tail.load(std::memory_order_acquire);
  }
  std::uint64_t free = tx_.capacity - (head - tx_seen_tail_);
  bool moved = false;
  if (slot.header_sent < kHeader) {
    if (free < kBlock) return false;
    // Messages start on a block and the capacity is a multiple of 64, so the envelope never
    // straddles the wrap (Note [ring link layout]).
    std::memcpy(tx_.data + head % tx_.capacity, slot.header, kHeader);
    head += kBlock;
    free -= kBlock;
    slot.header_sent = kHeader;
    moved = true;
  }
  // At most two rounds: up to the end of the data area, then from its start.
  while (slot.sent < slot.ready && free > 0) {
    std::uint64_t pos = head % tx_.capacity;
    std::size_t n = static_cast<std::size_t>(
        std::min<std::uint64_t>({tx_.capacity - pos, free, slot.ready - slot.sent}));
    std::memcpy(tx_.data + pos, slot.data + slot.sent, n);
    head += n;
    free -= n;
    slot.sent += n;
    moved = true;
  }
  if (slot.sent == slot.bytes) {
    // The padding is produced before `done`, so the next envelope starts on a block; the
    // receiver skips it (rx_next_) without reading it.
    std::uint64_t pad = round_up(slot.bytes) - slot.bytes;
    if (free >= pad) {
      head += pad;
      slot.done = true;
      moved = true;
    }
  }
  if (moved) {
    // One store per poll, after every copy: the consumer's acquire load of head then sees those
    // bytes, and seq_cst orders it before doorbell_ring()'s load of sleepers (Note [doorbell]).
    tx_.control->head.store(head, std::memory_order_seq_cst);
    ring_peer();
  }
  return moved;
}

bool RingLink::poll_recv(RecvSlot& slot) {
  // Acquire, against poll_send()'s store: every byte below head is visible.
  const std::uint64_t head = rx_.control->head.load(std::memory_order_acquire);
  rx_seen_head_ = head;
  bool moved = false;
  if (!slot.header_arrived) {
    // The previous message's padding may not be produced yet (head < rx_next_): unsigned
    // arithmetic must not take that for an envelope.
    if (head < rx_next_ || head - rx_next_ < kBlock) return false;
    std::memcpy(&slot.header, rx_.data + rx_next_ % rx_.capacity, kHeader);
    slot.header_got = kHeader;
    slot.header_arrived = true;
    rx_payload_start_ = rx_next_ + kBlock;
    rx_next_ = rx_payload_start_ + round_up(slot.bytes);
    // Releases the envelope (and the previous message's padding).
    publish_tail(rx_payload_start_);
    moved = true;
  }
  // A peer whose envelope disagrees is reported by the runner; do not interpret its payload, and
  // land nothing before the runner accepted the envelope (Note [accept before landing]).
  if (!slot.accepted || slot.header.payload_bytes != slot.bytes) return moved;
  // Capped: head may already cover the next message's envelope and payload.
  const std::uint64_t in_ring = std::min<std::uint64_t>(head - rx_payload_start_, slot.bytes);
  if (in_ring <= slot.arrived) return moved;
  if (!slot.must_land) {
    // Read in place: the bytes keep their ring space until recv_release() hands it back.
    slot.arrived = static_cast<std::size_t>(in_ring);
    return true;
  }
  while (slot.arrived < in_ring) {
    std::uint64_t pos = (rx_payload_start_ + slot.arrived) % rx_.capacity;
    std::size_t n = static_cast<std::size_t>(
        std::min<std::uint64_t>(rx_.capacity - pos, in_ring - slot.arrived));
    if (slot.stream) {  // Note [streaming copy-out] (kernels/copy.h)
      kernels::copy_streaming(slot.landing + slot.arrived, rx_.data + pos, n);
    } else {
      std::memcpy(slot.landing + slot.arrived, rx_.data + pos, n);
    }
    slot.arrived += n;
  }
  publish_tail(rx_payload_start_ + slot.arrived);  // landed bytes no longer need the ring
  return true;
}

RecvView RingLink::recv_view(const RecvSlot& slot) {
  if (slot.must_land) return {slot.landing + slot.consumed, slot.arrived - slot.consumed};
  std::uint64_t pos = (rx_payload_start_ + slot.consumed) % rx_.capacity;
  std::size_t n = static_cast<std::size_t>(
      std::min<std::uint64_t>(rx_.capacity - pos, slot.arrived - slot.consumed));
  return {rx_.data + pos, n};
}

void RingLink::recv_release(RecvSlot& slot, std::size_t bytes) {
  slot.consumed += bytes;
  if (slot.must_land) return;  // its ring space went back when poll_recv() copied it out
  publish_tail(rx_payload_start_ + slot.consumed);
}

void RingLink::publish_tail(std::uint64_t tail) noexcept {
  // Note [lazy tail]: space is handed back in batches of a quarter ring, so a stream of small
  // messages does not bounce the tail's cache line to the producer on every message. The
  // producer can always write into the other three quarters, and the consumer publishes as soon
  // as it has consumed a quarter, so a producer waiting for space is never left waiting.
  if (tail - rx_published_tail_ < rx_.capacity / 4) return;
  rx_published_tail_ = tail;
  rx_.control->tail.store(tail, std::memory_order_seq_cst);
  ring_peer();
}

bool RingLink::moved_since_poll(bool for_send, bool for_recv) const noexcept {
  // seq_cst loads: they must not pass the caller's seq_cst announcement (Note [doorbell]).
  return (for_recv && rx_.control->head.load(std::memory_order_seq_cst) != rx_seen_head_) ||
         (for_send && tx_.control->tail.load(std::memory_order_seq_cst) != tx_seen_tail_);
}

void RingLink::wait(double max_seconds, bool for_send, bool for_recv) {
  const LinkWait one{this, for_send, for_recv};
  wait_links(&one, 1, max_seconds);
}

void wait_links(const LinkWait* waits, std::size_t n, double max_seconds) {
  if (n == 0) return;
  Doorbell* bell = waits[0].link->doorbell();
  if (bell == nullptr) {
    waits[0].link->wait(max_seconds, waits[0].for_send, waits[0].for_recv);
    return;
  }
  // seq is read before announcing: a peer that then sees us announced bumps it, and the futex
  // below returns at once; one that produced before the announcement is caught by the re-check.
  const std::uint32_t seen = bell->seq.load(std::memory_order_acquire);
  bell->sleepers.fetch_add(1, std::memory_order_seq_cst);
  // Note [doorbell]: re-check every link on this doorbell after announcing, so a peer that
  // produced on any of them in between is not missed.
  bool ready = false;
  for (std::size_t i = 0; i < n && !ready; ++i) {
    ready = waits[i].link->moved_since_poll(waits[i].for_send, waits[i].for_recv);
  }
  if (!ready) doorbell_wait(bell, seen, max_seconds);
  // Relaxed: leaving late only costs a peer one needless wake-up.
  bell->sleepers.fetch_sub(1, std::memory_order_relaxed);
}

}  // namespace mwms::collective
