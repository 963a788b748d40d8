// The data-movement seam (DESIGN "The transport seam", STYLE items 26-28): a Link moves the
// messages of one peer pair in both directions and nothing else. It knows no dtype, reduction or
// collective; the PlanRunner gives it request slots (owned by the runner, reused for every
// message, so nothing is allocated per chunk) and polls them.
//
// Note [link messages]: a message is one envelope (FrameHeader, checked by the runner) followed by
// exactly `bytes` of payload. A send slot's payload may become available bit by bit (`ready`
// grows as the runner finalises the bytes the send depends on, Note [ring gating]); a link sends
// at most `ready` bytes. A receive slot's payload is consumed bit by bit: the link makes bytes
// available (`arrived`), the runner reads them through recv_view() and hands them back with
// recv_release(). Messages between two ranks are FIFO per direction.
//
// Note [accept before landing]: a receive's envelope is checked by the runner (plan_runner.cc,
// message_channel.cc) before any payload byte is written at `landing`, which is often the
// caller's buffer (the all-gather half of a ring, the last step of recursive doubling, a
// broadcast): a call the ranks disagree on raises CollectiveMismatchError and must leave that
// buffer as it was (communicator.h). So a link writes at `landing` only once the runner has set
// RecvSlot::accepted, which it does right after the envelope matched, and polls again at once.
// Until then a link may hold payload where it is (a shared-memory ring, the socket buffer, a
// small bounce buffer of its own) but not land it. Payload read through recv_view() from the
// link's own memory needs no acceptance: the runner reads nothing before it accepted.
#pragma once

#include <cstddef>
#include <memory>

#include "collective/flat_layout.h"
#include "collective/frame.h"

namespace mwms::collective {

struct Doorbell;  // transport/ring_link.h

// Note [flat slots]: a link between two ranks whose memory both can map (shared memory, the
// in-memory transport) offers each rank a flat area of kFlatAreaBytes and a staging area of
// kFlatStageAreaBytes (collective/flat_layout.h) that only its owner writes and every peer
// reads: the flat all-reduce's slots. The transport
// only provides them, zeroed at creation and mapped by both ends; the engine lays them out
// (engine/flat_slots.h).
/// The flat areas of a link's two ranks (Note [flat slots]): this rank's, which only this rank
/// writes and every peer reads, and the peer's, read here. All null: the link has none.
struct FlatSlots {
  char* own = nullptr;
  const char* peer = nullptr;
  char* own_stage = nullptr;  // the staging areas (kFlatStageAreaBytes, Note [flat staging])
  const char* peer_stage = nullptr;
  Doorbell* own_bell = nullptr;   // this rank sleeps on it (Note [doorbell], ring_link.h)
  Doorbell* peer_bell = nullptr;  // rung after this rank publishes into its own area
};

/// What one link is, read by the engine's descriptions and errors. Published by every Link. What
/// the selector reads of a transport is its table entry's LinkTuning (Note [transport table]).
struct TransportCaps {
  const char* name = "?";         // the table entry's name ("tcp", "shm", "mpi", "mem")
  std::size_t chunk_bytes = 256 << 10;  // preferred pipeline chunk
  int streams = 0;                // connections to the peer (TCP: MWMS_NSOCKS_PERPEER); 0: n/a
};

/// One outgoing message (Note [link messages]). The runner fills header/data/bytes/ready; the
/// link advances the rest. Reused for every message: reset with start().
struct SendSlot {
  const FrameHeader* header = nullptr;
  const char* data = nullptr;
  std::size_t bytes = 0;   // payload bytes of the message
  std::size_t ready = 0;   // payload bytes the runner allows out so far (<= bytes)
  // Link progress: envelope bytes and payload bytes taken; `done` once the link no longer reads
  // `data` (the buffer may be reused).
  std::size_t header_sent = 0;
  std::size_t sent = 0;
  bool done = false;
  void* link_state = nullptr;  // a link's per-message handle (e.g. an MPI request index)

  void start(const FrameHeader* h, const char* d, std::size_t n, std::size_t ready_bytes) {
    header = h;
    data = d;
    bytes = n;
    ready = ready_bytes;
    header_sent = 0;
    sent = 0;
    done = false;
    link_state = nullptr;
  }
};

/// One incoming message (Note [link messages]).
struct RecvSlot {
  FrameHeader header;         // envelope as received; valid once header_arrived
  bool header_arrived = false;
  char* landing = nullptr;    // where the payload lands (a link may bypass it: see must_land)
  std::size_t bytes = 0;      // payload bytes expected (the envelope's payload_bytes is checked)
  bool must_land = true;      // false: the runner only reads the payload through recv_view
  std::size_t arrived = 0;    // payload bytes available to recv_view
  std::size_t consumed = 0;   // payload bytes released by the runner
  std::size_t header_got = 0; // link progress on the envelope
  bool accepted = false;      // the runner checked the envelope: Note [accept before landing]
  bool stream = false;        // land with non-temporal stores (Note [streaming copy-out])
  void* link_state = nullptr;

  void start(char* dst, std::size_t n, bool land) {
    header_arrived = false;
    accepted = false;
    landing = dst;
    bytes = n;
    must_land = land;
    stream = false;
    arrived = 0;
    consumed = 0;
    header_got = 0;
    link_state = nullptr;
  }
  bool done() const { return header_arrived && consumed == bytes; }
};

/// Contiguous payload bytes readable now.
struct RecvView {
  const char* data = nullptr;
  std::size_t bytes = 0;
};

/// The link to one peer. Non-blocking, driven by the runner's polling; one thread at a time.
/// Errors (peer closed, reset, corrupt stream) are thrown as PeerError/BackendError from the poll
/// calls; the runner adds the collective's context.
class Link {
 public:
  virtual ~Link() = default;
  virtual const TransportCaps& caps() const noexcept = 0;
  /// The peer's rank.
  virtual int peer() const noexcept = 0;

  /// Advances an outgoing message; true when bytes moved or the slot completed.
  virtual bool poll_send(SendSlot& slot) = 0;
  /// Advances an incoming message: fills the envelope, then makes payload available.
  virtual bool poll_recv(RecvSlot& slot) = 0;
  /// Payload bytes of `slot` from slot.consumed on that are readable now (contiguous: a link
  /// whose bytes wrap around returns the part before the wrap).
  virtual RecvView recv_view(const RecvSlot& slot) = 0;
  /// The runner is done with `bytes` more payload bytes of `slot` (from slot.consumed).
  virtual void recv_release(RecvSlot& slot, std::size_t bytes) = 0;

  /// A descriptor to poll(2) on while blocked (POLLIN for receives, POLLOUT for sends), or -1.
  virtual int wait_fd() const noexcept { return -1; }
  /// The poll(2) events to ask of wait_fd() for `wanted` (POLLIN: a receive is blocked, POLLOUT:
  /// a send): `wanted` itself for a socket; POLLIN for a descriptor that only ever polls
  /// readable, such as an epoll set (Note [tcp wait fd]).
  virtual short wait_events(short wanted) const noexcept { return wanted; }
  /// Sleeps at most `max_seconds` or until the link may have progressed, for links without a
  /// descriptor (shm: a futex). `for_send`/`for_recv` say which direction is blocked.
  virtual void wait(double max_seconds, bool for_send, bool for_recv);

  /// Note [doorbell]: the rank-wide wake-up word this link sleeps on, when the rank's other links
  /// share it (every RingLink of a rank: shm and the in-memory transport), else nullptr. Links of
  /// one word are waited on together by wait_links(), so a peer that moved on any of them wakes
  /// the rank.
  virtual Doorbell* doorbell() const noexcept { return nullptr; }
  /// With doorbell(): whether the link moved in a blocked direction since the last poll (its
  /// peer produced into the receive ring or freed space in the send ring). Called only after the
  /// rank announced itself on the doorbell, which is what makes the re-check race-free.
  virtual bool moved_since_poll(bool for_send, bool for_recv) const noexcept {
    (void)for_send;
    (void)for_recv;
    return true;
  }
  /// Note [flat slots]: the two ranks' flat areas when both live in memory both ends map (shared
  /// memory, the in-memory transport), else all null. The same `own` on every link of a rank.
  virtual FlatSlots flat_slots() const noexcept { return {}; }
  /// With flat_slots(), between messages: copies the envelope of the next message the peer sent,
  /// if a whole one is there, into *out without consuming anything (Note [flat mismatch]);
  /// false when none is (or the link cannot tell). Reads the producer's position with acquire.
  virtual bool peek_envelope(FrameHeader* out) const noexcept {
    (void)out;
    return false;
  }
};

/// One entry of wait_links(): a link and the direction(s) blocked on it.
struct LinkWait {
  Link* link = nullptr;
  bool for_send = false;
  bool for_recv = false;
};

/// Sleeps at most `max_seconds` or until one of `waits` may have progressed. All entries must
/// share the first one's doorbell() (nullptr: the first entry's Link::wait() alone). One
/// announcement on the doorbell, then a re-check of every entry, then one futex sleep (Note
/// [doorbell]): waiting on one link of several would miss a peer that produced on another one
/// before the announcement, and sleep until the caller's cap. Never throws; one thread.
void wait_links(const LinkWait* waits, std::size_t n, double max_seconds);

}  // namespace mwms::collective
