// An MPI link: the messages of one peer pair as MPI point-to-point messages on a private
// communicator (MpiComm). Compiled only with MWMS_WITH_MPI; this directory and
// transport/registry.cc are the only places in src/collective that know MPI (STYLE item 4).
//
// Note [mpi link messages]: a message (Note [link messages]) is one MPI message of the 44-byte
// envelope on tag kEnvelopeTag, then its payload as MPI messages of exactly `chunk` bytes each
// (the last one shorter) on tag kPayloadTag: chunk i covers payload bytes [i*chunk, (i+1)*chunk).
// Both sides cut the payload at the same offsets, so every receive is posted with the size of the
// message it matches, and a size that differs is a PeerError (chunk sizes differ between ranks)
// rather than silent corruption. MPI does not overtake messages with the same (source, tag,
// communicator), so envelopes and payload pieces of consecutive messages match in order; the
// direction is told apart by source and destination rank. A sender posts piece i only once
// SendSlot::ready covers all of it (Note [ring gating]); every count is at most `chunk`, which the
// transport keeps below INT_MAX. At most kWindow pieces are in flight per direction; the request
// arrays live in the link (nothing is allocated per message). Payload receives are posted only
// after the runner accepted the envelope (RecvSlot::accepted, Note [accept before landing]), so a
// mismatched collective never has receives posted into the caller's buffer. MPI cannot land bytes anywhere
// but in the posted buffer: a payload lands in RecvSlot::landing (in_place_recv false) and
// `arrived` counts the completed pieces in order.
//
// Note [mpi staging]: a payload the plan only reads (RecvSlot::must_land false: a reduction's
// operand) lands instead in a link-owned staging ring of kStageSlots pieces, and a piece's slot
// is reposted only once the runner released all of it. The reduction then reads bytes that the
// receive has just written (in cache) instead of a message-sized scratch area it wrote long
// before (from memory), as Open MPI's segmented ring does with its two segment buffers. The ring
// is allocated at the first such receive and reused (no allocation per message). Two slots of
// 8 MiB pieces (16 MiB per link, as four 4 MiB slots were) measured the same as four.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <exception>
#include <memory>
#include <vector>

#include "bootstrap/mpi_runtime.h"
#include "collective/transport/link.h"

namespace mwms::collective {

class MpiLink;

/// The private communicator (MPI_Comm_dup of MPI_COMM_WORLD, MPI_ERRORS_RETURN) of one libmwms
/// communicator's MPI links, shared by them and freed with the last one (unless MPI was already
/// finalised). Used from one thread at a time, like the links.
class MpiComm {
 public:
  /// Takes ownership of `comm`.
  MpiComm(bootstrap::MpiRuntime& runtime, MPI_Comm comm);
  ~MpiComm();
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;

  MPI_Comm comm() const noexcept { return comm_; }
  bootstrap::MpiRuntime& runtime() const noexcept { return runtime_; }
  /// Links register themselves (at connect, not per message) so that one link's wait() makes
  /// progress on all of them: MPI only moves bytes inside MPI calls.
  void attach(MpiLink* link);
  void detach(MpiLink* link) noexcept;
  /// Tests the outstanding requests of every attached link; true when any completed (or failed:
  /// the error is kept for that link's next poll). Takes the runtime's lock.
  bool progress() noexcept;

 private:
  bootstrap::MpiRuntime& runtime_;
  MPI_Comm comm_;
  std::vector<MpiLink*> links_;
};

/// Caps of every MPI link.
TransportCaps mpi_caps(std::size_t chunk_bytes);

class MpiLink final : public Link {
 public:
  static constexpr int kEnvelopeTag = 1;
  static constexpr int kPayloadTag = 2;
  static constexpr int kWindow = 8;  // payload pieces in flight per direction
  static constexpr std::size_t kStageSlots = 2;  // pieces of the staging ring (Note [mpi staging])

  /// The link to rank `peer`, which is `peer_mpi_rank` in `comm`; payload pieces of `chunk_bytes`
  /// (<= INT_MAX, the same on both sides).
  MpiLink(int peer, int peer_mpi_rank, std::shared_ptr<MpiComm> comm, std::size_t chunk_bytes);
  /// Cancels outstanding receives and frees outstanding sends (a failed collective); never throws.
  ~MpiLink() override;

  const TransportCaps& caps() const noexcept override { return caps_; }
  int peer() const noexcept override { return peer_; }
  bool poll_send(SendSlot& slot) override;
  bool poll_recv(RecvSlot& slot) override;
  RecvView recv_view(const RecvSlot& slot) override;
  void recv_release(RecvSlot& slot, std::size_t bytes) override;
  /// MPI has no descriptor to sleep on and progresses only inside MPI calls: tests the requests
  /// of every link of the communicator, sched_yield() between tests for the first millisecond,
  /// then sleeps 100 us between tests; returns at the first completion or after `max_seconds`
  /// (the runner passes at most 10 ms, then looks at the control plane).
  void wait(double max_seconds, bool for_send, bool for_recv) override;

  /// MpiComm::progress() for this link: tests without throwing (errors are kept).
  bool progress_nothrow() noexcept;

 private:
  // One direction's requests: [0] the envelope, [1 + i % kWindow] payload piece i.
  struct Direction {
    static constexpr int kSlots = kWindow + 1;
    MPI_Request requests[kSlots];
    MPI_Status statuses[kSlots];
    int indices[kSlots];
    int expect[kSlots];  // bytes the request must carry
    bool completed[kSlots];
    std::size_t bytes = 0;     // payload bytes of the message
    std::size_t pieces = 0;    // payload pieces of the message
    std::size_t posted = 0;    // pieces posted
    std::size_t finished = 0;  // pieces completed, in order
    bool envelope_done = false;
    bool active = false;       // a message is in progress
    std::exception_ptr error;  // failure seen by wait(), rethrown by the next poll
  };

  void begin(Direction& d, std::size_t bytes);
  bool test(Direction& d, bool is_recv, int count);
  void advance(Direction& d) noexcept;
  std::size_t piece_bytes(const Direction& d, std::size_t i) const noexcept;
  void cancel_outstanding(Direction& d, bool is_recv) noexcept;

  int peer_;
  int peer_mpi_;
  std::shared_ptr<MpiComm> comm_;
  std::size_t chunk_;
  TransportCaps caps_;
  Direction send_;
  Direction recv_;
  std::vector<char> staging_;  // kStageSlots pieces, allocated at the first staged receive
};

}  // namespace mwms::collective
