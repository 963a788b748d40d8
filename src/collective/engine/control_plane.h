// The control plane (DESIGN "The transport seam"): small TCP side links to every peer, whatever
// carries the data, for what must reach a rank that is blocked on a link that cannot fail loudly
// (shared memory has no EOF): the abort relay, stall blame and, through the closed control link of
// a process that died, death notices, and the notice of an orderly shutdown. Messages are
// FrameHeaders whose fields each protocol names in control_frames.h (Note [control frames]): the
// ready barrier, the abort relay (the failed rank, its AbortCause and FailureCause, the reason as
// payload), stall notices, the finalized notice and heartbeats.
//
// Note [stall blame]: a rank blocked on peer p for half the timeout (half the stall-warning
// interval when that is shorter, Note [stall warning]) tells every rank "I wait for p in seq S",
// and "I no longer wait" (root -1) once it moves again. A rank that times out follows that chain
// from the peer it waits for to the rank that waits for nobody, and names it: every rank's
// TimeoutError names the rank that actually stalled, not an innocent neighbour that waits for it
// too. The edges are followed whatever collective each rank is in: with one rank stopped, a
// neighbour can have finished collective S (its last bytes came before the stop) and wait in
// S + 1 for a rank still stuck in S (3-4 ranks on shared memory: 1 survivor in 13 named its
// neighbour while edges were only followed within one seq). The cleared notice keeps an old
// edge from being followed after the wait it described has ended.

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
//
// Note [heartbeat]: a peer that dies closes its control link, which every wait of the runner sees
// within ~10 ms; a peer that is frozen (SIGSTOP, a debugger), whose host lost power or whose
// network was cut closes nothing. So every rank sends a kHeartbeat (root = the sender, count =
// its interval in ms, 0: it sends no more) on every control link every MWMS_HEARTBEAT_SECONDS,
// and a peer from which nothing at all arrived for kLostIntervals of max(its interval, ours) is
// lost: between collectives the next collective fails at once with a PeerError naming it; inside
// a collective a wait for it fails the same way instead of running into the whole op timeout. A
// peer that finalized (Note [finalize]) or closed its link is never lost: it said what happened.
//
// Threading: one small thread per communicator, not heartbeats piggybacked on the runner's
// poll(), because between collectives (the application computes for minutes) nothing else runs
// to send them, and a silent rank would look frozen. The thread sends under writer_ (every frame
// is written whole under it, so its frames never interleave with an abort or a stall notice).
// Reading stays single-threaded: reader_ guards everything read off the control links and every
// field it updates. The engine holds reader_ for a whole collective (EngineBackend::run: a
// ReaderLock, one atomic exchange and one store per collective, no syscall; 2-rank 4-byte
// all-reduces measured at main's median, 0.68-0.69 us) and reads the links in its waits, as before;
// the thread only try_locks it, every interval, to read what arrived between collectives, so it
// never delays a collective and a collective never waits for it except in the rare instant it
// holds the lock. A failure it finds (a lost peer, an abort, a malformed frame) is recorded, and
// the next collective throws it (throw_if_failed) with its own op and seq. Silence is measured
// from the last poll (polled_), never from a stale clock: a peer is silent only if a poll found
// nothing from it. The steady state allocates nothing (the allocation-counter test runs with the
// thread alive); a heartbeat costs a 44-byte write per peer per interval.
#pragma once

#include <poll.h>
#include <sched.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "collective/engine/control_frames.h"
#include "collective/frame.h"
#include "common/socket.h"
#include "mwms/errors.h"

namespace mwms::collective {

/// The lock over what the control links deliver (Note [heartbeat]): one atomic exchange to take
/// it and a plain store to release it, half of std::mutex's cost on the hot path (the engine
/// takes it once per collective). A blocked lock() yields until it is free: the only other
/// holder is the heartbeat thread, for the microseconds of a non-blocking poll. BasicLockable and
/// try_lock(), so std::unique_lock and std::lock_guard work with it.
class ReaderLock {
 public:
  void lock() noexcept {
    while (held_.exchange(true, std::memory_order_acquire)) {
      while (held_.load(std::memory_order_relaxed)) sched_yield();
    }
  }
  bool try_lock() noexcept {
    return !held_.load(std::memory_order_relaxed) &&
           !held_.exchange(true, std::memory_order_acquire);
  }
  void unlock() noexcept { held_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> held_{false};
};


/// Names of every rank, for errors.
struct PeerNames {
  std::vector<std::string> addresses;  // by rank
  std::vector<std::string> tasks;      // by rank ("chief 0", "worker 1")
  /// By rank: the peer-info's process id for a rank on this host, "" otherwise (Note [dead
  /// process], bootstrap/peer_info.cc). May be empty: nothing is judged then.
  std::vector<std::string> processes;
};

class ControlPlane {
 public:
  /// A peer is lost after this many of its heartbeat intervals without a message (Note
  /// [heartbeat]).
  static constexpr int kLostIntervals = 4;

  /// `links` by rank (invalid for this rank); non-blocking sockets.
  ControlPlane(int rank, std::vector<common::Socket> links, PeerNames names);
  /// Stops the heartbeat thread, then closes the links. Never throws.
  ~ControlPlane();
  ControlPlane(const ControlPlane&) = delete;
  ControlPlane& operator=(const ControlPlane&) = delete;

  /// Note [heartbeat]: sends every peer this rank's interval, then, when `interval_seconds` > 0,
  /// starts the thread that sends a heartbeat every `interval_seconds` and reads the links
  /// between collectives. `base` (rank, task) is the context of the failures it records. Call
  /// once, after ready_barrier(). Never throws (a thread that cannot start is logged; then no
  /// heartbeat is sent or checked).
  void start_heartbeat(double interval_seconds, const ErrorContext& base) noexcept;
  /// Stops the heartbeat thread (idempotent; waits for it, at most one write deadline ~0.5 s).
  void stop_heartbeat() noexcept;
  /// The lock the engine holds while it runs a collective (Note [heartbeat]): every other member
  /// but the send_* functions and closed() must be called with it held once the heartbeat runs.
  std::unique_lock<ReaderLock> hold() { return std::unique_lock<ReaderLock>(reader_); }
  /// Throws what the heartbeat thread found between collectives (a lost peer: PeerError naming
  /// it; an abort: the class the failing rank saw), with `ctx`'s op and seq. O(1).
  void throw_if_failed(const ErrorContext& ctx) const {
    if (failure_.set) throw_failure(ctx);
  }
  /// True when `peer` is lost (Note [heartbeat]): the heartbeat is on, `peer` neither finalized
  /// nor closed its link, and the last poll found nothing from it for kLostIntervals intervals.
  bool lost(int peer) const;
  /// True when `peer` runs on this host and its process is gone although its links may still be
  /// open (Note [dead process]: they are held by a process it forked). Looks at /proc at most
  /// every kProcessCheckSeconds per peer (a cached false in between); needs the reader lock like
  /// lost(). An error raised with gone_reason() sets ErrorContext::cause to FailureCause::kDied.
  bool process_gone(int peer);
  static constexpr double kProcessCheckSeconds = 0.25;
  /// Why `peer` is gone, for errors: its name and that its process no longer exists.
  std::string gone_reason(int peer) const;
  /// Seconds `peer` had been silent at the last poll; -1 when the heartbeat is off.
  double silent_seconds(int peer) const;
  /// Why `peer` is lost, for errors: its name, how long it was silent, the likely causes. An
  /// error raised with it sets ErrorContext::cause to FailureCause::kStalled.
  std::string lost_reason(int peer) const;
  /// "rank 2 (worker 2, 10.0.0.3:2222)", for messages.
  std::string name_of(int peer) const;
  /// Seconds without a message after which `peer` is lost (kLostIntervals of the larger of its
  /// interval and ours); 0 when the heartbeat is off.
  double lost_after(int peer) const;

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
  /// Thread safe (an atomic flag).
  bool closed(int peer) const {
    return peer >= 0 && !open_[static_cast<std::size_t>(peer)].load(std::memory_order_relaxed);
  }
  /// Throws any abort that has already arrived from any rank, then gives `peer` a moment
  /// (250 ms) to deliver the abort it sent before its link failed, and throws it if it came.
  /// Called when a data link to `peer` failed.
  void drain(int peer, const ErrorContext& ctx);

  /// Tells every peer that `failed_rank` failed (best effort, at most ~1 s, never throws). Sent
  /// once per communicator. `why` travels with it: the peers' relayed errors carry it in
  /// ErrorContext::cause (Note [no finalize after a stall] reads it).
  void send_abort(int failed_rank, const std::string& reason, AbortCause cause,
                  FailureCause why) noexcept;
  /// True once this rank sent its own abort (send_abort: Communicator::abort() or a failure of
  /// its own), not when it only relayed a peer's. Thread safe. Note [local abort]: the runner's
  /// waits check it, so a collective blocked on one thread fails when another thread aborts.
  bool gave_up() const noexcept { return gave_up_.load(std::memory_order_acquire); }
  /// The reason given to the send_abort() that made gave_up() true. Read only after gave_up().
  const std::string& gave_up_reason() const noexcept { return gave_up_reason_; }
  /// Tells every peer that this rank waits for `waited` in collective `seq` (Note [stall blame]);
  /// `waited` -1: it no longer waits (sent when a rank that sent a notice moves again).
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
  /// The rank to blame for a stall when this rank waits for `waited` (Note [stall blame]).
  int blame(int waited) const;

 private:
  // One file per protocol (Note [control frames]): read_message (control_plane.cc) hands each
  // frame to its protocol's record_*; control_ready.cc, control_abort.cc, control_stall.cc,
  // control_finalize.cc and control_heartbeat.cc hold the rest.
  void read_message(int peer, const ErrorContext& ctx);
  [[noreturn]] void record_abort(int peer, const FrameHeader& h, const ErrorContext& ctx);
  void record_stall(int peer, const FrameHeader& h);
  void record_finalized(int peer, const FrameHeader& h, const ErrorContext& ctx);
  void record_heartbeat(int peer, const FrameHeader& h, const ErrorContext& ctx);
  void note_failure(std::string text, AbortCause cause, FailureCause why, int peer,
                    const char* where) noexcept;
  void send_heartbeats(std::uint64_t interval_ms) noexcept;
  void heartbeat_loop() noexcept;
  void check_between_collectives() noexcept;
  [[noreturn]] void throw_failure(const ErrorContext& ctx) const;

  int rank_;
  std::vector<common::Socket> links_;
  std::unique_ptr<std::atomic<bool>[]> open_;  // by rank; written by the reader, read by senders
  PeerNames names_;
  std::vector<pollfd> fds_;   // preallocated: kMaxExtra + one per peer
  std::vector<int> fd_peer_;  // rank of fds_[i] (-1 for extra)
  std::vector<int> waits_for_;           // Note [stall blame]: rank -> rank it waits for
  std::vector<std::int64_t> finalized_after_;  // Note [finalize]: by rank, -1 until it finalized
  int first_finalized_ = -1;                   // the rank that finalized after fewest collectives
  std::uint64_t first_finalized_seq_ = 0;
  std::atomic<bool> abort_sent_{false};
  std::atomic<bool> gave_up_{false};  // Note [local abort]
  std::string gave_up_reason_;        // written once, before gave_up_ is set
  bool finalized_sent_ = false;  // under writer_

  // Note [heartbeat].
  ReaderLock reader_;  // everything read off the links and every field above it updates
  std::mutex writer_;  // every frame written
  double interval_ = 0;                        // ours, seconds; 0: off
  std::vector<double> peer_interval_;          // by rank, from their heartbeats (reader_)
  std::vector<common::Clock::time_point> heard_;  // last message from each rank (reader_)
  common::Clock::time_point polled_;           // end of the last poll (reader_)
  std::uint64_t messages_ = 0;                 // frames read so far (reader_)
  std::vector<bool> heartbeat_off_;            // by rank: stop sending (writer_)
  std::vector<common::Clock::time_point> process_checked_;  // Note [dead process] (reader_)
  std::vector<bool> gone_;                                   // by rank, once seen (reader_)
  ErrorContext base_;
  struct Failure {
    bool set = false;
    AbortCause cause = AbortCause::kPeer;
    FailureCause why = FailureCause::kUnknown;
    int peer = -1;
    std::string text;
  } failure_;                                  // found by the thread (reader_)
  std::mutex stop_mutex_;
  std::condition_variable stop_cv_;
  bool stop_ = false;                          // under stop_mutex_
  std::thread thread_;
};

}  // namespace mwms::collective
