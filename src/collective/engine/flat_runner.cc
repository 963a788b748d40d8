// The flat all-reduce's executor (Note [flat all-reduce], algorithms/flat_all_reduce.cc): the
// PlanRunner publishes this rank's contribution in its flat area and reduces every rank's where
// it lies, waiting for each with the same deadline, stall notices and peer checks as a plan.
//
// Note [flat mismatch]: a flat all-reduce sends no frames, so a rank in it never meets the
// envelope check of a plan, and a peer in a plan never meets its slot. Both look for the other in
// their slow path (after MWMS_SPIN_MICROSECONDS without progress) and report the two calls with
// check_frame, as two plans would be:
//   - a rank waiting in flat call k reads the envelope of a frame sent to it by any peer that has
//     not published k: that peer cannot be past this call, so the frame is of another call;
//   - a rank waiting in a plan reads every peer's next flat header: one published with this seq
//     (or an earlier one) is another call. A peer that published a later seq has finished this
//     collective, and its last bytes are on the links.
// Two ranks in flat calls that differ (count, dtype, op, kind) see it in the header at once.
#include <algorithm>
#include <cstring>

#include "collective/engine/flat_slots.h"
#include "collective/engine/plan_runner.h"
#include "collective/engine/runner_state.h"
#include "collective/transport/ring_link.h"
#include "common/logging.h"
#include "kernels/reduce.h"

namespace mwms::collective {

void PlanRunner::run_flat(const CollectiveCall& call, char* buffer, double timeout_seconds,
                          const ErrorContext& ctx) {
  const std::size_t bytes = call.count * dtype_size(call.dtype);
  MWMS_CHECK(flat_own_ != nullptr && bytes <= kFlatPayloadBytes &&
                 static_cast<std::size_t>(call.world_size) == links_.size(),
             "flat all-reduce over links without flat slots");
  const std::uint32_t k = ++flat_index_;
  const std::uint64_t tag = k | static_cast<std::uint64_t>(flat_identity_bits(call)) << 32;
  const std::size_t lines = flat_line_count(bytes);
  const FrameHeader expect = flat_envelope(call);
  publish_flat(call, buffer, bytes, k, tag);
  State st;
  st.timeout = timeout_seconds;
  st.progress = 1;  // the first wait reads the clock (Note [idle time])
  // Rank order, whatever the arrival order: every rank computes the same bits (as gather does).
  for (int q = 0; q < call.world_size; ++q) {
    const FlatLine* l =
        q == call.rank ? flat_lines(flat_own_, k) : await_flat(q, k, tag, lines, expect, st, ctx);
    if (q == 0) {
      if (q != call.rank) gather_flat(l, bytes, buffer);  // rank 0's buffer holds it already
      continue;
    }
    // One line is reduced where it lies; more are gathered first (Note [flat lines]).
    const char* src = l[0].data;
    if (lines > 1) {
      gather_flat(l, bytes, flat_scratch_.data());
      src = flat_scratch_.data();
    }
    kernels::reduce(buffer, src, call.count, call.dtype, call.op);
  }
  if (call.op == ReduceOp::kMean) {
    kernels::scale_divide(buffer, call.count, call.dtype, call.world_size);
  }
  if (st.notice_sent) control_->send_stall_notice(static_cast<std::uint64_t>(ctx.seq), -1);
}

// The identity line, then each data line's bytes and its tag (Note [flat lines]).
void PlanRunner::publish_flat(const CollectiveCall& call, const char* buffer, std::size_t bytes,
                              std::uint32_t k, std::uint64_t tag) {
  FlatIdentity* id = flat_identity(flat_own_, k);
  id->seq.store(call.seq, std::memory_order_relaxed);
  id->count.store(static_cast<std::uint32_t>(call.count), std::memory_order_relaxed);
  id->kind_dtype_op.store(static_cast<std::uint32_t>(call.kind) |
                              static_cast<std::uint32_t>(call.dtype) << 8 |
                              static_cast<std::uint32_t>(call.op) << 16,
                          std::memory_order_relaxed);
  FlatLine* l = flat_lines(flat_own_, k);
  const std::size_t lines = flat_line_count(bytes);
  for (std::size_t j = 0; j < lines; ++j) {
    const std::size_t at = j * kFlatLineData;
    // A constant size for the full lines: the compiler inlines it (a call per line cost ~10 ns).
    if (at + kFlatLineData <= bytes) {
      std::memcpy(l[j].data, buffer + at, kFlatLineData);
    } else if (at < bytes) {
      std::memcpy(l[j].data, buffer + at, bytes - at);
    }
    // The last one seq_cst: before doorbell_ring()'s loads of the peers' sleepers (Note
    // [doorbell]).
    l[j].tag.store(tag, j + 1 == lines ? std::memory_order_seq_cst : std::memory_order_release);
  }
  for (Doorbell* bell : flat_peer_bell_) {
    if (bell != nullptr) doorbell_ring(bell);
  }
}

// The data lines of `peer` for flat call k once every one carries its tag; a tag of another
// call (the same k, another identity) is a mismatch.
const FlatLine* PlanRunner::await_flat(int peer, std::uint32_t k, std::uint64_t tag,
                                       std::size_t lines, const FrameHeader& expect, State& st,
                                       const ErrorContext& ctx) {
  const char* area = flat_peer_[static_cast<std::size_t>(peer)];
  const FlatLine* l = flat_lines(area, k);
  // The last line first: its owner writes the lines in order, so once that one is there the
  // others are too, and this rank does not pull lines away from a writer still filling them.
  for (std::size_t i = 0; i < lines; ++i) {
    const std::size_t j = i == 0 ? lines - 1 : i - 1;
    std::uint64_t t;
    while (static_cast<std::uint32_t>(t = l[j].tag.load(std::memory_order_acquire)) != k) {
      wait_flat(peer, &l[j], k, expect, st, ctx);
    }
    if (t != tag) throw_flat_mismatch(peer, expect, flat_envelope(*flat_identity(area, k)), ctx);
  }
  ++st.progress;
  return l;
}

void PlanRunner::gather_flat(const FlatLine* lines, std::size_t bytes, char* out) {
  std::size_t at = 0;
  for (; at + kFlatLineData <= bytes; at += kFlatLineData) {
    std::memcpy(out + at, lines[at / kFlatLineData].data, kFlatLineData);  // inlined (above)
  }
  if (at < bytes) std::memcpy(out + at, lines[at / kFlatLineData].data, bytes - at);
}

// One round of waiting for `peer`'s slot, as wait() is for a plan's links: spin (or yield), then
// the slow path: mismatch, stall, deadline and peer checks, and a short sleep on the doorbell.
void PlanRunner::wait_flat(int peer, const FlatLine* line, std::uint32_t k,
                           const FrameHeader& expect, State& st, const ErrorContext& ctx) {
  if ((++st.spins & 15) != 0 || st.progress != st.progress_seen) {
    note_progress(st, ctx);
    relax();
    return;
  }
  const double idle = since(st.last_progress);
  if (idle < options_.spin_seconds) {
    relax();
    return;
  }
  check_frames_of_unpublished(k, expect, ctx);
  watch_stall(st, static_cast<std::uint64_t>(ctx.seq), peer, idle, ctx);
  const double left = st.timeout - idle;
  if (left <= 0) throw_timeout(st, peer, ctx);
  if (control_ != nullptr) check_peers(st, peer, idle, ctx);
  // Note [doorbell]: seq read, announce, re-check, sleep; publish_flat() stores k (seq_cst)
  // before it looks for sleepers, so one of the two sees the other.
  const std::uint32_t seen = flat_bell_->seq.load(std::memory_order_acquire);
  flat_bell_->sleepers.fetch_add(1, std::memory_order_seq_cst);
  if (static_cast<std::uint32_t>(line->tag.load(std::memory_order_seq_cst)) != k) {
    doorbell_wait(flat_bell_, seen, std::min(left, 0.01));
  }
  flat_bell_->sleepers.fetch_sub(1, std::memory_order_relaxed);
  // Then the control plane without waiting, so an abort or a closed peer is seen within ~10 ms.
  if (control_ != nullptr) control_->poll(nullptr, 0, 0, ctx);
}

// Note [flat mismatch], first half.
void PlanRunner::check_frames_of_unpublished(std::uint32_t k, const FrameHeader& expect,
                                             const ErrorContext& ctx) {
  for (std::size_t p = 0; p < links_.size(); ++p) {
    if (flat_peer_[p] == nullptr) continue;
    const std::uint64_t t = flat_lines(flat_peer_[p], k)[0].tag.load(std::memory_order_acquire);
    if (static_cast<std::uint32_t>(t) == k) continue;
    Link& link = *links_[p];
    if (!link.moved_since_poll(false, true)) continue;
    RecvSlot probe;  // envelope only: never accepted, so nothing lands
    probe.start(nullptr, 0, false);
    try {
      link.poll_recv(probe);
    } catch (const Error&) {
      rethrow_link_error(static_cast<int>(p), ctx);
    }
    if (probe.header_arrived) throw_flat_mismatch(static_cast<int>(p), expect, probe.header, ctx);
  }
}

// Note [flat mismatch], second half: called by wait() while a plan waits.
void PlanRunner::check_flat_peers(const FrameHeader& expect, const ErrorContext& ctx) {
  const std::uint32_t next = flat_index_ + 1;
  for (std::size_t p = 0; p < flat_peer_.size(); ++p) {
    if (flat_peer_[p] == nullptr) continue;
    const std::uint64_t t = flat_lines(flat_peer_[p], next)[0].tag.load(std::memory_order_acquire);
    if (static_cast<std::uint32_t>(t) != next) continue;
    const FrameHeader got = flat_envelope(*flat_identity(flat_peer_[p], next));
    if (got.seq > expect.seq) continue;  // past this collective
    throw_flat_mismatch(static_cast<int>(p), expect, got, ctx);
  }
}

void PlanRunner::throw_flat_mismatch(int peer, const FrameHeader& expect, const FrameHeader& got,
                                     const ErrorContext& ctx) {
  ErrorContext c = control_ != nullptr ? control_->with_peer(ctx, peer) : ctx;
  c.peer_rank = peer;
  c.transport = links_[static_cast<std::size_t>(peer)]->caps().name;
  check_frame(expect, got, c);
  // check_frame passes identical envelopes only, and a flat one never equals a plan's.
  throw CollectiveMismatchError(
      "rank " + std::to_string(peer) + " is in another call than " + describe(expect), c);
}

}  // namespace mwms::collective
