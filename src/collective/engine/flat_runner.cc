// The flat all-reduce's executor (Note [flat all-reduce], algorithms/flat_all_reduce.cc): the
// PlanRunner publishes this rank's contribution in its flat or staging area and reduces every
// rank's where it lies, waiting for each with the same deadline, stall notices and peer checks
// as a plan. Up to kFlatPayloadBytes the call goes in tagged lines (Note [flat lines]), above it
// through the staging areas:
//
// Note [flat staging]: each rank copies its buffer into its staging set and tags it contributed;
// then it reduces its own segment (ring_segment) from every rank's set in rank order, a block of
// kFlatBlockBytes at a time so that the partial sum stays in L1, writes the result into its set
// and its buffer, and tags it reduced; then it copies every other rank's reduced segment. Two
// hand-offs per call whatever the world size, against 2 log2(n) for Rabenseifner and 2(n-1) for
// the ring: what matters when ranks outnumber cores and every hand-off may wait for the
// scheduler. Each segment is reduced by one rank, so every rank gets the same bits. The sets
// alternate by call number as the lines do: a rank rewrites a set only after every rank
// published the call in between, which each did after it had read all of the set's last call.
//
// Note [flat mismatch]: a flat all-reduce sends no frames, so a rank in it never meets the
// envelope check of a plan, and a peer in a plan never meets its slot. Both look for the other in
// their slow path (after MWMS_SPIN_MICROSECONDS without progress) and report the two calls with
// check_frame, as two plans would be:
//   - a rank waiting in flat call k compares the identity of every peer that published k (in
//     either protocol) with its own, and peeks (Link::peek_envelope, nothing consumed) at the
//     envelope of a frame waiting from any peer that has not published k; if the peer still
//     has not published k after the peek, the frame is of another call (a peer that published k
//     and went on stored its tag before that frame's bytes, so the second look sees it);
//   - a rank waiting in a plan reads every peer's next flat call: one published with this seq
//     (or an earlier one) is another call. A peer that published a later seq has finished this
//     collective, and its last bytes are on the links.
// Two ranks in flat calls of one protocol that differ see it in the tags at once.
#include <algorithm>
#include <cstring>

#include "collective/engine/flat_slots.h"
#include "collective/engine/plan_runner.h"
#include "collective/engine/runner_state.h"
#include "collective/transport/ring_link.h"
#include "common/logging.h"
#include "kernels/reduce.h"

namespace mwms::collective {

namespace {

void write_identity(FlatIdentity& id, const CollectiveCall& call) {
  id.seq.store(call.seq, std::memory_order_relaxed);
  id.count.store(static_cast<std::uint32_t>(call.count), std::memory_order_relaxed);
  id.kind_dtype_op.store(static_cast<std::uint32_t>(call.kind) |
                             static_cast<std::uint32_t>(call.dtype) << 8 |
                             static_cast<std::uint32_t>(call.op) << 16,
                         std::memory_order_relaxed);
}

}  // namespace

void PlanRunner::run_flat(const CollectiveCall& call, char* buffer, double timeout_seconds,
                          const ErrorContext& ctx) {
  const std::size_t bytes = call.count * dtype_size(call.dtype);
  MWMS_CHECK(flat_own_ != nullptr && bytes <= kFlatStageBytes &&
                 static_cast<std::size_t>(call.world_size) == links_.size(),
             "flat all-reduce over links without flat slots");
  const std::uint64_t k = ++flat_index_;
  const FrameHeader expect = flat_envelope(call);
  State st;
  st.timeout = timeout_seconds;
  st.progress = 1;  // the first wait reads the clock (Note [idle time])
  if (bytes <= kFlatPayloadBytes) {
    flat_in_lines(call, buffer, k, expect, st, ctx);
  } else {
    flat_staged(call, buffer, k, expect, st, ctx);
  }
  if (st.notice_sent) control_->send_stall_notice(static_cast<std::uint64_t>(ctx.seq), -1);
}

// Note [flat lines].
void PlanRunner::flat_in_lines(const CollectiveCall& call, char* buffer, std::uint64_t k,
                               const FrameHeader& expect, State& st, const ErrorContext& ctx) {
  const std::size_t bytes = call.count * dtype_size(call.dtype);
  const std::uint64_t ident = flat_identity_word(call);
  const std::size_t lines = flat_line_count(bytes);
  publish_flat(call, buffer, bytes, k, ident);
  // Every peer's lines first, each one's identity checked: a call that any peer disagrees with
  // is refused before a byte of the buffer changes (communicator.h). Then the reduction in rank
  // order, whatever the arrival order: every rank computes the same bits (as gather does).
  for (int q = 0; q < call.world_size; ++q) {
    if (q != call.rank) await_flat(q, k, ident, lines, expect, st, ctx);
  }
  for (int q = 0; q < call.world_size; ++q) {
    const FlatLine* l =
        flat_lines(q == call.rank ? flat_own_ : flat_peer_[static_cast<std::size_t>(q)], k);
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
  if (call.op == ReduceOp::kMean) {  // once, at the end (the staged path divides per block)
    kernels::scale_divide(buffer, call.count, call.dtype, call.world_size);
  }
}

// The identity line, then each data line's bytes and its tag (Note [flat lines]).
void PlanRunner::publish_flat(const CollectiveCall& call, const char* buffer, std::size_t bytes,
                              std::uint64_t k, std::uint64_t ident) {
  write_identity(*flat_identity(flat_own_, k), call);
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
    flat_publish(l[j].tag, ident, k, j + 1 == lines);
  }
  ring_flat_peers();
}

void PlanRunner::ring_flat_peers() noexcept {
  for (Doorbell* bell : flat_peer_bell_) {
    if (bell != nullptr) doorbell_ring(bell);
  }
}

// Returns once every data line of `peer` for flat call k carries its tag; a tag of another call
// (the same k, another identity) is a mismatch.
void PlanRunner::await_flat(int peer, std::uint64_t k, std::uint64_t ident, std::size_t lines,
                            const FrameHeader& expect, State& st, const ErrorContext& ctx) {
  const char* area = flat_peer_[static_cast<std::size_t>(peer)];
  const FlatLine* l = flat_lines(area, k);
  // The last line first: its owner writes the lines in order, so once that one is there the
  // others are too, and this rank does not pull lines away from a writer still filling them.
  for (std::size_t i = 0; i < lines; ++i) {
    const std::size_t j = i == 0 ? lines - 1 : i - 1;
    await_tag(peer, l[j].tag, *flat_identity(area, k), k, ident, expect, st, ctx);
  }
  ++st.progress;
}

void PlanRunner::gather_flat(const FlatLine* lines, std::size_t bytes, char* out) {
  std::size_t at = 0;
  for (; at + kFlatLineData <= bytes; at += kFlatLineData) {
    std::memcpy(out + at, lines[at / kFlatLineData].data, kFlatLineData);  // inlined (above)
  }
  if (at < bytes) std::memcpy(out + at, lines[at / kFlatLineData].data, bytes - at);
}

// Note [flat staging].
void PlanRunner::flat_staged(const CollectiveCall& call, char* buffer, std::uint64_t k,
                             const FrameHeader& expect, State& st, const ErrorContext& ctx) {
  const std::size_t esize = dtype_size(call.dtype);
  const int n = call.world_size;
  const std::uint64_t ident = flat_identity_word(call);
  FlatStageHead* head = flat_stage_head(flat_own_stage_, k);
  char* mine = flat_stage_data(flat_own_stage_, k);
  write_identity(head->identity, call);
  std::memcpy(mine, buffer, call.count * esize);
  flat_publish(head->contributed, ident, k, true);
  ring_flat_peers();
  auto data_of = [&](int q) -> const char* {
    return q == call.rank ? mine
                          : flat_stage_data(flat_peer_stage_[static_cast<std::size_t>(q)], k);
  };
  auto head_of = [&](int q) {
    return flat_stage_head(flat_peer_stage_[static_cast<std::size_t>(q)], k);
  };
  for (int q = 0; q < n; ++q) {
    if (q == call.rank) continue;
    await_tag(q, head_of(q)->contributed, head_of(q)->identity, k, ident, expect, st, ctx);
  }
  ++st.progress;
  // Copying all of the buffer, this rank's segment too, measured no slower than copying only the
  // others' and reading its own from the buffer (n = 4 on 2 cores, 8 KiB - 1 MiB; 512 KiB 166-182
  // against 158-163 us).
  const Segment seg = ring_segment(call.count, n, call.rank);
  const std::size_t off = seg.offset * esize;
  const std::size_t len = seg.count * esize;
  char* acc = flat_scratch_.data();
  for (std::size_t b = 0; b < len; b += kFlatBlockBytes) {
    const std::size_t bl = std::min(kFlatBlockBytes, len - b);
    std::memcpy(acc, data_of(0) + off + b, bl);
    for (int q = 1; q < n; ++q) {
      kernels::reduce(acc, data_of(q) + off + b, bl / esize, call.dtype, call.op);
    }
    if (call.op == ReduceOp::kMean) kernels::scale_divide(acc, bl / esize, call.dtype, n);
    std::memcpy(mine + off + b, acc, bl);
    std::memcpy(buffer + off + b, acc, bl);
  }
  flat_publish(head->reduced, ident, k, true);
  ring_flat_peers();
  for (int q = 0; q < n; ++q) {
    if (q == call.rank) continue;
    await_tag(q, head_of(q)->reduced, head_of(q)->identity, k, ident, expect, st, ctx);
    ++st.progress;
    const Segment s = ring_segment(call.count, n, q);
    std::memcpy(buffer + s.offset * esize, data_of(q) + s.offset * esize, s.count * esize);
  }
}

// Waits until `t` (of `peer`, whose call is described by `id`) carries call k; another identity
// with the same k is a mismatch.
void PlanRunner::await_tag(int peer, const FlatTag& t, const FlatIdentity& id, std::uint64_t k,
                           std::uint64_t ident, const FrameHeader& expect, State& st,
                           const ErrorContext& ctx) {
  while (t.k.load(std::memory_order_acquire) != k) wait_flat(peer, t, k, expect, st, ctx);
  if (t.identity.load(std::memory_order_relaxed) != ident) {
    throw_flat_mismatch(peer, expect, flat_envelope(id), ctx);
  }
}

// One round of waiting for `peer`'s tag `t`, as wait() is for a plan's links: spin (or yield),
// then the slow path: mismatch, stall, deadline and peer checks, and a short sleep on the bell.
void PlanRunner::wait_flat(int peer, const FlatTag& t, std::uint64_t k, const FrameHeader& expect,
                           State& st, const ErrorContext& ctx) {
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
  check_flat_call(k, expect, ctx);
  watch_stall(st, static_cast<std::uint64_t>(ctx.seq), peer, idle, ctx);
  const double left = st.timeout - idle;
  if (left <= 0) throw_timeout(st, peer, ctx);
  if (control_ != nullptr) check_peers(st, peer, idle, ctx);
  // Note [doorbell]: seq read, announce, re-check, sleep; a publisher stores its tag (seq_cst)
  // before it looks for sleepers, so one of the two sees the other.
  const std::uint32_t seen = flat_bell_->seq.load(std::memory_order_acquire);
  flat_bell_->sleepers.fetch_add(1, std::memory_order_seq_cst);
  if (t.k.load(std::memory_order_seq_cst) != k) {
    doorbell_wait(flat_bell_, seen, std::min(left, 0.01));
  }
  flat_bell_->sleepers.fetch_sub(1, std::memory_order_relaxed);
  // Then the control plane without waiting, so an abort or a closed peer is seen within ~10 ms.
  if (control_ != nullptr) control_->poll(nullptr, 0, 0, ctx);
}

// Whether `p` published flat call k in either protocol, and the envelope of what it published.
bool PlanRunner::flat_published(std::size_t p, std::uint64_t k, FrameHeader* got) const {
  const FlatLine& line0 = flat_lines(flat_peer_[p], k)[0];
  if (line0.tag.k.load(std::memory_order_acquire) == k) {
    *got = flat_envelope(*flat_identity(flat_peer_[p], k));
    return true;
  }
  const FlatStageHead* head = flat_stage_head(flat_peer_stage_[p], k);
  if (head->contributed.k.load(std::memory_order_acquire) == k) {
    *got = flat_envelope(head->identity);
    return true;
  }
  return false;
}

// Note [flat mismatch], first half.
void PlanRunner::check_flat_call(std::uint64_t k, const FrameHeader& expect,
                                 const ErrorContext& ctx) {
  for (std::size_t p = 0; p < links_.size(); ++p) {
    if (flat_peer_[p] == nullptr) continue;
    FrameHeader got;
    if (flat_published(p, k, &got)) {
      if (std::memcmp(&got, &expect, sizeof(FrameHeader)) != 0) {
        throw_flat_mismatch(static_cast<int>(p), expect, got, ctx);
      }
      continue;  // in this call: it may be past it, its frames are not ours to read
    }
    FrameHeader frame;
    if (!links_[p]->peek_envelope(&frame)) continue;
    // The peer may have published k and gone on to the next collective since the look above: it
    // stores its tag before its ring's head, so after this acquire of the head the tag shows.
    if (flat_published(p, k, &got)) continue;
    throw_flat_mismatch(static_cast<int>(p), expect, frame, ctx);
  }
}

// Note [flat mismatch], second half: called by wait() while a plan waits.
void PlanRunner::check_flat_peers(const FrameHeader& expect, const ErrorContext& ctx) {
  const std::uint64_t next = flat_index_ + 1;
  for (std::size_t p = 0; p < flat_peer_.size(); ++p) {
    FrameHeader got;
    if (flat_peer_[p] == nullptr || !flat_published(p, next, &got)) continue;
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
