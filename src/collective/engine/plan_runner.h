// The engine's executor (DESIGN "The transport seam"): runs a Plan over per-peer links. It holds
// the gating state machine (Note [ring gating] in plan.h), posts one send and one receive at a
// time in plan order (Note [plan order]) into request slots it owns, checks every envelope
// against what the plan expects (so a rank that called a different collective is reported, not
// trusted), reduces received chunks through the kernels as they arrive, and waits with a deadline:
// it spins briefly, then sleeps on the links' descriptors or futexes together with the control
// plane, so an abort or the death of the peer it waits for interrupts it. It never allocates.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "collective/engine/control_plane.h"
#include "collective/plan.h"
#include "collective/transport/link.h"

namespace mwms::collective {

struct FlatLine;      // engine/flat_slots.h
struct FlatIdentity;  // engine/flat_slots.h
struct FlatTag;       // engine/flat_slots.h

struct RunnerOptions {
  std::size_t chunk_bytes = 256 << 10;  // reduce granularity (multiple of 64)
  double spin_seconds = 50e-6;          // poll without sleeping this long after the last progress
  bool yield_while_spinning = false;    // more ranks than cores on this host: yield, do not spin
  double stall_warn_seconds = 0;        // Note [stall warning]; 0: never warn
};

class PlanRunner {
 public:
  /// `links` by rank (nullptr for this rank and peers no plan talks to); `control` may be null
  /// (threaded tests without a control plane). Both outlive the runner.
  PlanRunner(std::vector<Link*> links, ControlPlane* control, RunnerOptions options);

  /// Runs `plan` to completion. Logs a warning every stall_warn_seconds without progress (Note
  /// [stall warning]). @throws TimeoutError when no byte moved for timeout_seconds
  /// (naming the rank to blame, Note [stall blame]), PeerError (a link failed, a peer aborted,
  /// closed without finalizing, or is lost (Note [heartbeat]) while this rank waited for it,
  /// naming it),
  /// CollectiveMismatchError (an envelope describes another call, or a peer finalized before
  /// this collective: Note [finalize]).
  void run(const Plan& plan, DataType dtype, ReduceOp op, int world_size, double timeout_seconds,
           const ErrorContext& ctx);
  /// Runs the flat all-reduce of `call` on `buffer` (in place; call.count elements, at most
  /// kFlatStageBytes, in lines up to kFlatPayloadBytes and staged above) over the links' flat slots
  /// (Note [flat all-reduce] in algorithms/flat_all_reduce.cc), every link of the world offering
  /// them. Waits and fails like run(); a peer in another call (its slot, or a frame on its link) is
  /// a CollectiveMismatchError (Note [flat mismatch]).
  void run_flat(const CollectiveCall& call, char* buffer, double timeout_seconds,
                const ErrorContext& ctx);
  /// Whether every link offers flat slots (Note [flat slots]).
  bool has_flat_slots() const noexcept { return flat_own_ != nullptr; }

 private:
  struct State;
  std::size_t send_limit(const Transfer& t, const State& st) const;
  bool pump_send(const Plan& plan, State& st, const ErrorContext& ctx);
  bool pump_recv(const Plan& plan, State& st, const ErrorContext& ctx);
  void consume(const Plan& plan, State& st, Link& link);
  void wait(const Plan& plan, State& st, const ErrorContext& ctx);
  void note_progress(State& st, const ErrorContext& ctx);
  void relax() const;
  [[noreturn]] void throw_timeout(const State& st, int waited, const ErrorContext& ctx);
  void check_peers(const State& st, int waited, double idle, const ErrorContext& ctx);
  void sleep_on_links(Link* reader, Link* writer, double left, const ErrorContext& ctx);
  void watch_stall(State& st, std::uint64_t seq, int waited, double idle, const ErrorContext& ctx);
  [[noreturn]] void throw_lost(const State& st, int waited, const ErrorContext& ctx);
  void warn_stall(std::uint64_t seq, int waited, double idle, double timeout,
                  const ErrorContext& ctx) const;
  Link& link_to(int peer, const ErrorContext& ctx);
  [[noreturn]] void rethrow_link_error(int peer, const ErrorContext& ctx);
  // Throws CollectiveMismatchError if a peer finalized before `seq` (Note [finalize]).
  void throw_if_finalized(std::uint64_t seq, const ErrorContext& ctx) const;
  // engine/flat_runner.cc
  void flat_in_lines(const CollectiveCall& call, char* buffer, std::uint64_t k,
                     const FrameHeader& expect, State& st, const ErrorContext& ctx);
  void flat_staged(const CollectiveCall& call, char* buffer, std::uint64_t k,
                   const FrameHeader& expect, State& st, const ErrorContext& ctx);
  void publish_flat(const CollectiveCall& call, const char* buffer, std::size_t bytes,
                    std::uint64_t k, std::uint64_t ident);
  void ring_flat_peers() noexcept;
  void await_flat(int peer, std::uint64_t k, std::uint64_t ident, std::size_t lines,
                  const FrameHeader& expect, State& st, const ErrorContext& ctx);
  static void gather_flat(const FlatLine* lines, std::size_t bytes, char* out);
  void await_tag(int peer, const FlatTag& t, const FlatIdentity& id, std::uint64_t k,
                 std::uint64_t ident, const FrameHeader& expect, State& st,
                 const ErrorContext& ctx);
  void wait_flat(int peer, const FlatTag& t, std::uint64_t k, const FrameHeader& expect, State& st,
                 const ErrorContext& ctx);
  bool flat_published(std::size_t p, std::uint64_t k, FrameHeader* got) const;
  void check_flat_call(std::uint64_t k, const FrameHeader& expect, const ErrorContext& ctx);
  void check_flat_peers(const FrameHeader& expect, const ErrorContext& ctx);
  [[noreturn]] void throw_flat_mismatch(int peer, const FrameHeader& expect, const FrameHeader& got,
                                        const ErrorContext& ctx);

  std::vector<Link*> links_;
  ControlPlane* control_;
  RunnerOptions options_;
  SendSlot send_slot_;
  RecvSlot recv_slot_;
  // Note [flat slots]: this rank's flat area and bell, every peer's area by rank (null when a
  // link has none: then flat_own_ is null too), and the number of the last flat call.
  char* flat_own_ = nullptr;
  Doorbell* flat_bell_ = nullptr;
  std::vector<const char*> flat_peer_;
  char* flat_own_stage_ = nullptr;  // Note [flat staging]
  std::vector<const char*> flat_peer_stage_;
  std::vector<Doorbell*> flat_peer_bell_;
  std::uint64_t flat_index_ = 0;  // never wraps: Note [flat lines]
  // A peer's contribution, gathered (Note [flat lines]); a block of partial sums (Note [flat
  // staging]).
  std::vector<char> flat_scratch_;
};

}  // namespace mwms::collective
