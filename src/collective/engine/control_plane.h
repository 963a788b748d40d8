// The control plane (DESIGN "The transport seam"): small TCP side links to every peer, whatever
// carries the data, for what must reach a rank that is blocked on a link that cannot fail loudly
// (shared memory has no EOF): the abort relay, stall blame and, through the closed control link of
// a process that died, death notices, and the notice of an orderly shutdown. Messages are
// FrameHeaders of kind kAbort (root = the rank that failed, op = AbortCause, payload = reason),
// kStallNotice (root = the rank waited for, step = the waiting rank, seq = the collective) or
// kFinalized (root = the sender, seq = the collectives it completed, no payload).
//
// Note [stall blame]: a rank blocked on peer p for half the timeout tells every rank "I wait for
// p in seq S". A rank that times out follows that chain from the peer it waits for to the rank
// that waits for nobody, and names it: every rank's TimeoutError names the rank that actually
// stalled, not an innocent neighbour that waits for it too.
//
// Note [finalize]: Communicator::finalize() runs a barrier, then sends kFinalized (seq = the
// number of collectives it completed, the barrier included) to every peer, then closes its links.
// A peer that has seen it knows two things: a closed control link of that rank is an orderly
// shutdown, not a death (the rank completed every collective before `seq`, so whatever it sent
// for them is already in this rank's links and a wait for it keeps going under the timeout); and
// a collective numbered `seq` or later can never complete, so a rank that calls one fails at once
// with CollectiveMismatchError naming the finalized rank instead of "died" or a timeout. A control
// link that closes without kFinalized while this rank waits for that peer stays what it was: the
// peer exited before the collective completed, or died (PeerError, within ~10 ms). The frame has
// a fixed size and no payload; each field is checked (root = the sender, payload 0, step 0, seq
// below 2^62) before it is used, and a malformed one is a PeerError.
#pragma once

#include <poll.h>

#include <cstdint>
#include <string>
#include <vector>

#include "collective/frame.h"
#include "common/socket.h"
#include "mwms/errors.h"

namespace mwms::collective {

/// Why a rank aborted; carried in the abort frame so relayed errors keep their class.
enum class AbortCause : std::uint8_t { kPeer = 0, kMismatch = 1, kTimeout = 2 };

/// Names of every rank, for errors.
struct PeerNames {
  std::vector<std::string> addresses;  // by rank
  std::vector<std::string> tasks;      // by rank ("chief 0", "worker 1")
};

class ControlPlane {
 public:
  /// `links` by rank (invalid for this rank); non-blocking sockets.
  ControlPlane(int rank, std::vector<common::Socket> links, PeerNames names);

  /// Start-up barrier over the control links: returns once every peer has connected all its links
  /// (and, for shared memory, mapped this rank's segment), so no rank leaves Communicator::create
  /// while a peer still needs something of it. @throws BootstrapError naming a peer that left or
  /// did not answer before `deadline`.
  void ready_barrier(common::Deadline deadline, const ErrorContext& ctx);

  /// `ctx` with the peer's rank, task and address filled in.
  ErrorContext with_peer(ErrorContext ctx, int peer) const;

  /// Waits up to `timeout_ms` (0: just looks) for `extra` descriptors (at most kMaxExtra) or a
  /// control message; handles every control message that arrived: stall and finalized notices
  /// are recorded (a malformed finalized notice is a PeerError), an abort is thrown with the class the failing rank saw (PeerError, CollectiveMismatchError
  /// or TimeoutError naming it). Returns true when an `extra` descriptor is ready.
  static constexpr int kMaxExtra = 4;
  bool poll(const pollfd* extra, int n_extra, int timeout_ms, const ErrorContext& ctx);
  /// True once `peer` closed its control link (it exited or died).
  bool closed(int peer) const { return peer >= 0 && !open_[static_cast<std::size_t>(peer)]; }
  /// Throws any abort that has already arrived from any rank, then gives `peer` a moment
  /// (250 ms) to deliver the abort it sent before its link failed, and throws it if it came.
  /// Called when a data link to `peer` failed.
  void drain(int peer, const ErrorContext& ctx);

  /// Tells every peer that `failed_rank` failed (best effort, at most ~1 s, never throws). Sent
  /// once per communicator.
  void send_abort(int failed_rank, const std::string& reason, AbortCause cause) noexcept;
  /// Tells every peer that this rank waits for `waited` in collective `seq` (Note [stall blame]).
  void send_stall_notice(std::uint64_t seq, int waited) noexcept;
  /// Tells every peer that this rank finalized after `collectives` collectives (Note
  /// [finalize]). Best effort (a peer that already closed is skipped), at most ~1 s, never
  /// throws; sent once per communicator.
  void send_finalized(std::uint64_t collectives) noexcept;
  /// The number of collectives `peer` completed before it finalized, -1 if it has not (as far
  /// as the messages read so far tell).
  std::int64_t finalized_after(int peer) const;
  /// A rank that finalized before collective `seq` (so it will never join it), -1 if none.
  /// O(1): called by every wait of the runner.
  int finalized_before(std::uint64_t seq) const {
    return first_finalized_ >= 0 && first_finalized_seq_ <= seq ? first_finalized_ : -1;
  }
  /// The rank to blame for a stall in `seq` when this rank waits for `waited`.
  int blame(std::uint64_t seq, int waited) const;

 private:
  void read_message(int peer, const ErrorContext& ctx);
  void record_finalized(int peer, const FrameHeader& h, const ErrorContext& ctx);

  int rank_;
  std::vector<common::Socket> links_;
  std::vector<bool> open_;
  PeerNames names_;
  std::vector<pollfd> fds_;   // preallocated: kMaxExtra + one per peer
  std::vector<int> fd_peer_;  // rank of fds_[i] (-1 for extra)
  std::vector<int> waits_for_;           // Note [stall blame]: rank -> rank it waits for
  std::vector<std::uint64_t> waits_seq_;
  std::vector<std::int64_t> finalized_after_;  // Note [finalize]: by rank, -1 until it finalized
  int first_finalized_ = -1;                   // the rank that finalized after fewest collectives
  std::uint64_t first_finalized_seq_ = 0;
  bool abort_sent_ = false;
  bool finalized_sent_ = false;
};

}  // namespace mwms::collective
