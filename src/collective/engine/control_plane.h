// The control plane (DESIGN "The transport seam"): small TCP side links to every peer, whatever
// carries the data, for what must reach a rank that is blocked on a link that cannot fail loudly
// (shared memory has no EOF): the abort relay, stall blame and, through the closed control link of
// a process that died, death notices. Messages are FrameHeaders of kind kAbort (root = the rank
// that failed, op = AbortCause, payload = reason) or kStallNotice (root = the rank waited for,
// step = the waiting rank, seq = the collective).
//
// Note [stall blame]: a rank blocked on peer p for half the timeout tells every rank "I wait for
// p in seq S". A rank that times out follows that chain from the peer it waits for to the rank
// that waits for nobody, and names it: every rank's TimeoutError names the rank that actually
// stalled, not an innocent neighbour that waits for it too.
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
  /// control message; handles every control message that arrived: stall notices are recorded,
  /// an abort is thrown with the class the failing rank saw (PeerError, CollectiveMismatchError
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
  /// The rank to blame for a stall in `seq` when this rank waits for `waited`.
  int blame(std::uint64_t seq, int waited) const;

 private:
  void read_message(int peer, const ErrorContext& ctx);

  int rank_;
  std::vector<common::Socket> links_;
  std::vector<bool> open_;
  PeerNames names_;
  std::vector<pollfd> fds_;   // preallocated: kMaxExtra + one per peer
  std::vector<int> fd_peer_;  // rank of fds_[i] (-1 for extra)
  std::vector<int> waits_for_;           // Note [stall blame]: rank -> rank it waits for
  std::vector<std::uint64_t> waits_seq_;
  bool abort_sent_ = false;
};

}  // namespace mwms::collective
