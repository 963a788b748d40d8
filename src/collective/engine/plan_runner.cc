#include "collective/engine/plan_runner.h"

#include <sched.h>

#include <algorithm>
#include <cstring>

#include "collective/engine/flat_slots.h"
#include "collective/engine/runner_state.h"
#include "common/logging.h"
#include "common/socket.h"
#include "kernels/copy.h"
#include "kernels/reduce.h"

namespace mwms::collective {

namespace {

constexpr std::size_t kHeader = sizeof(FrameHeader);

int next_with_send(const Plan& p, int i) {
  const int n = static_cast<int>(p.transfers.size());
  while (i < n && !p.transfers[static_cast<std::size_t>(i)].has_send) ++i;
  return i;
}
int next_with_recv(const Plan& p, int i) {
  const int n = static_cast<int>(p.transfers.size());
  while (i < n && !p.transfers[static_cast<std::size_t>(i)].has_recv) ++i;
  return i;
}

// Applies `a` to payload bytes [b, b + len) of `t`, seen at `src` (ChunkAction in plan.h).
void apply(const Transfer& t, const ChunkAction& a, std::size_t b, std::size_t len,
           const char* src, DataType dtype, ReduceOp op, int world_size) {
  const std::size_t elems = len / dtype_size(dtype);
  char* result;
  if (a.accumulate_into != nullptr) {
    result = a.accumulate_into + b;
    kernels::reduce(result, src, elems, dtype, op);
  } else {
    result = t.recv + b;
    if (src != result) std::memcpy(result, src, len);
  }
  if (a.operand != nullptr) kernels::reduce(result, a.operand + b, elems, dtype, op);
  if (a.scale) kernels::scale_divide(result, elems, dtype, world_size);
  if (a.copy_to != nullptr && a.copy_to + b != result) std::memmove(a.copy_to + b, result, len);
}

}  // namespace

PlanRunner::PlanRunner(std::vector<Link*> links, ControlPlane* control, RunnerOptions options)
    : links_(std::move(links)), control_(control), options_(options) {
  // Note [flat slots]: usable only when every peer's link has them (one null link: none).
  bool all = links_.size() > 1;
  int linked = 0;
  for (Link* l : links_) {
    if (l == nullptr) continue;
    ++linked;
    all = all && l->flat_slots().own != nullptr && l->flat_slots().own_stage != nullptr;
  }
  if (!all || linked + 1 != static_cast<int>(links_.size())) return;
  flat_peer_.assign(links_.size(), nullptr);
  flat_peer_bell_.assign(links_.size(), nullptr);
  flat_peer_stage_.assign(links_.size(), nullptr);
  for (std::size_t q = 0; q < links_.size(); ++q) {
    if (links_[q] == nullptr) continue;
    const FlatSlots f = links_[q]->flat_slots();
    flat_own_ = f.own;
    flat_bell_ = f.own_bell;
    flat_peer_[q] = f.peer;
    flat_peer_bell_[q] = f.peer_bell;
    flat_own_stage_ = f.own_stage;
    flat_peer_stage_[q] = f.peer_stage;
  }
  flat_scratch_.assign(std::max(kFlatPayloadBytes, kFlatBlockBytes), 0);
}

Link& PlanRunner::link_to(int peer, const ErrorContext& ctx) {
  bool known = peer >= 0 && peer < static_cast<int>(links_.size()) &&
               links_[static_cast<std::size_t>(peer)] != nullptr;
  MWMS_CHECK(known, "plan names rank " + std::to_string(peer) + " that has no link (" + ctx.op +
                        ")");
  return *links_[static_cast<std::size_t>(peer)];
}

void PlanRunner::rethrow_link_error(int peer, const ErrorContext& ctx) {
  ErrorContext c = control_ != nullptr ? control_->with_peer(ctx, peer) : ctx;
  c.peer_rank = peer;
  c.transport = links_[static_cast<std::size_t>(peer)]->caps().name;
  try {
    throw;
  } catch (const PeerError& e) {
    // The peer may have told us why it left: its abort names the real cause.
    if (control_ == nullptr) throw PeerError(e.message(), c);
    control_->drain(peer, c);
    const std::uint64_t seq = static_cast<std::uint64_t>(ctx.seq);
    throw_if_finalized(seq, ctx);
    if (control_->closed(peer) && control_->finalized_after(peer) < 0) {
      // Note [finalize]: a peer that finalized never leaves a collective it has not completed.
      // The link's own guess ("the peer process probably died") gives way to what is known.
      std::string text = e.message().substr(0, e.message().find(" (the peer process probably"));
      c.cause = FailureCause::kDied;
      throw PeerError(text + ": rank " + std::to_string(peer) + " closed its connections "
                      "without finalize(), so it shut down before seq " + std::to_string(seq) +
                      " completed, or its process died or aborted", c);
    }
    throw PeerError(e.message(), c);
  } catch (const BackendError& e) {
    throw BackendError(e.message(), e.native_code(), c);
  }
}

void PlanRunner::throw_if_finalized(std::uint64_t seq, const ErrorContext& ctx) const {
  const int gone = control_->finalized_before(seq);
  if (gone < 0) return;
  // Note [finalize]: every rank takes part in every collective, so this one cannot complete.
  const std::int64_t after = control_->finalized_after(gone);
  throw CollectiveMismatchError(
      "rank " + std::to_string(gone) + " finalized after " + std::to_string(after) +
          " collective(s) and will not join " + ctx.op + " seq " + std::to_string(seq) +
          " (every rank must call the same collectives before finalize())",
      control_->with_peer(ctx, gone));
}

// Payload bytes of the current send transfer that may go out now (Note [ring gating]).
std::size_t PlanRunner::send_limit(const Transfer& t, const State& st) const {
  if (t.send_gate < 0 || t.send_gate < st.r) return t.send_bytes;
  if (t.send_gate > st.r || t.send_gate_whole || !st.recv_started || !st.recv_checked) return 0;
  return std::min(t.send_bytes, recv_slot_.consumed);
}

bool PlanRunner::pump_send(const Plan& plan, State& st, const ErrorContext& ctx) {
  if (st.s >= st.n) return false;
  const Transfer& t = plan.transfers[static_cast<std::size_t>(st.s)];
  if (!st.send_started) {
    send_slot_.start(&t.send_header, t.send, t.send_bytes, send_limit(t, st));
    st.send_started = true;
  } else {
    send_slot_.ready = std::max(send_slot_.ready, send_limit(t, st));
  }
  Link& link = link_to(t.send_peer, ctx);
  bool moved = false;
  try {
    moved = link.poll_send(send_slot_);
  } catch (const Error&) {
    rethrow_link_error(t.send_peer, ctx);
  }
  if (send_slot_.done) {
    st.s = next_with_send(plan, st.s + 1);
    st.send_started = false;
    return true;
  }
  return moved;
}

void PlanRunner::consume(const Plan& plan, State& st, Link& link) {
  const std::size_t i = static_cast<std::size_t>(st.r);
  const Transfer& t = plan.transfers[i];
  const ChunkAction& a = plan.actions[i];
  const std::size_t esize = dtype_size(st.dtype);
  while (recv_slot_.arrived > recv_slot_.consumed) {
    const std::size_t pending = recv_slot_.arrived - recv_slot_.consumed;
    RecvView v = link.recv_view(recv_slot_);
    if (v.bytes == 0) break;
    const std::size_t b = recv_slot_.consumed;
    std::size_t len = v.bytes;
    if (t.recv_in_chunks) {
      // Reduce whole chunks while they are hot in cache; the tail once the payload is complete,
      // or what a wrapped view offers.
      if (len >= options_.chunk_bytes) {
        len = options_.chunk_bytes;
      } else if (b + len != t.recv_bytes && len == pending && !st.force_partial) {
        break;  // a whole chunk is coming (unless the link cannot hold one: see wait())
      }
      len -= len % esize;
      if (len == 0) {
        // Part of an element has arrived; a wrapped view always ends on a whole one (links
        // wrap on 64-byte boundaries, Note [ring link layout]).
        MWMS_CHECK(v.bytes == pending, "link view splits an element");
        break;
      }
      apply(t, a, b, len, v.data, st.dtype, st.op, st.world_size);
    } else if (v.data != t.recv + b) {
      std::memcpy(t.recv + b, v.data, len);
    }
    link.recv_release(recv_slot_, len);
  }
}

bool PlanRunner::pump_recv(const Plan& plan, State& st, const ErrorContext& ctx) {
  if (st.r >= st.n) return false;
  const Transfer& t = plan.transfers[static_cast<std::size_t>(st.r)];
  if (t.recv_gate >= 0 && st.s <= t.recv_gate) return false;  // buffer still being sent
  if (!st.recv_started) {
    recv_slot_.start(t.recv, t.recv_bytes, t.recv_must_land);
    recv_slot_.stream = st.stream_landing && t.recv_must_land;
    st.recv_started = true;
    st.recv_checked = false;
  }
  Link& link = link_to(t.recv_peer, ctx);
  bool moved = false;
  try {
    moved = link.poll_recv(recv_slot_);
  } catch (const Error&) {
    rethrow_link_error(t.recv_peer, ctx);
  }
  if (!recv_slot_.header_arrived) return moved;
  if (!st.recv_checked) {
    // A matching envelope is byte-identical to the expected one (the sender builds it with the
    // same header_for); only a difference pays for the context and the field-by-field report.
    if (std::memcmp(&t.expect_header, &recv_slot_.header, sizeof(FrameHeader)) != 0) {
      ErrorContext c = control_ != nullptr ? control_->with_peer(ctx, t.recv_peer) : ctx;
      c.peer_rank = t.recv_peer;
      c.transport = link.caps().name;
      check_frame(t.expect_header, recv_slot_.header, c);
    }
    st.recv_checked = true;
    // Note [accept before landing] (link.h): only now may the link land payload; poll again at
    // once so that what already arrived is not left for the next round.
    recv_slot_.accepted = true;
    try {
      moved = link.poll_recv(recv_slot_) || moved;
    } catch (const Error&) {
      rethrow_link_error(t.recv_peer, ctx);
    }
  }
  const std::size_t before = recv_slot_.consumed;
  consume(plan, st, link);
  if (recv_slot_.done()) {
    st.r = next_with_recv(plan, st.r + 1);
    st.recv_started = false;
    return true;
  }
  return moved || recv_slot_.consumed != before;
}

void PlanRunner::wait(const Plan& plan, State& st, const ErrorContext& ctx) {
  // Note [idle time]: the deadline counts time without progress since the last wait saw some.
  // While spinning, look at the clock every 16th round only: a read costs as much as a poll, and
  // a small collective that completes within 16 rounds never reads it (Note [idle time]).
  if ((++st.spins & 15) != 0 || st.progress != st.progress_seen) {
    note_progress(st, ctx);
    relax();
    return;
  }
  const double idle = since(st.last_progress);
  // What can move: a receive that is not gated on our own send, a send with bytes allowed.
  const Transfer* ts = plan.transfers.data();
  const bool want_read = st.r < st.n && !(ts[st.r].recv_gate >= 0 && st.s <= ts[st.r].recv_gate);
  const bool gated_send = st.send_started && send_slot_.header_sent == kHeader &&
                          send_slot_.sent >= send_slot_.ready && send_slot_.ready < send_slot_.bytes;
  const bool want_write = st.s < st.n && !gated_send;
  const int waited = want_read ? ts[st.r].recv_peer : (st.s < st.n ? ts[st.s].send_peer : -1);
  if (idle < options_.spin_seconds) {
    relax();
    return;
  }
  // Waiting for a whole chunk that a small link buffer (or a lazily returned one) cannot hold:
  // reduce what is there instead of sleeping, so a transfer never waits on itself.
  if (st.recv_started && st.recv_checked && recv_slot_.arrived > recv_slot_.consumed &&
      !st.force_partial) {
    st.force_partial = true;
    return;
  }
  // Note [flat mismatch]: a peer that waits in a flat all-reduce of this seq never sends.
  if (flat_own_ != nullptr && waited >= 0) {
    check_flat_peers(want_read ? ts[st.r].expect_header : ts[st.s].send_header, ctx);
  }
  if (waited >= 0) watch_stall(st, static_cast<std::uint64_t>(ctx.seq), waited, idle, ctx);
  const double left = st.timeout - idle;
  if (left <= 0) throw_timeout(st, waited, ctx);
  if (control_ != nullptr) check_peers(st, waited, idle, ctx);
  sleep_on_links(want_read ? &link_to(ts[st.r].recv_peer, ctx) : nullptr,
                 want_write ? &link_to(ts[st.s].send_peer, ctx) : nullptr, left, ctx);
}

// The spin side of wait(): progress since the last look ends a stall notice and restarts the
// idle clock (read on every 16th round only, Note [idle time]).
void PlanRunner::note_progress(State& st, const ErrorContext& ctx) {
  if (st.notice_sent && st.progress != st.progress_seen) {
    // Note [stall blame]: moving again; the edge this rank announced is gone.
    control_->send_stall_notice(static_cast<std::uint64_t>(ctx.seq), -1);
    st.notice_sent = false;
  }
  if ((st.spins & 15) == 0) {
    st.progress_seen = st.progress;
    st.warns = 0;
    st.last_progress = common::Clock::now();
    if (st.start == common::Clock::time_point{}) st.start = st.last_progress;
  }
}

// One spin round: with more ranks than cores on the host a pause would burn the time slice the
// peer needs to make the progress this rank waits for, so it yields instead.
void PlanRunner::relax() const {
  if (options_.yield_while_spinning) {
    sched_yield();
  } else {
    cpu_relax();
  }
}

void PlanRunner::throw_timeout(const State& st, int waited, const ErrorContext& ctx) {
  // Note [stall blame]: the rank at the end of the waiting chain, not the one next to us.
  const int peer = control_ != nullptr ? control_->blame(waited) : waited;
  std::string via;
  if (peer != waited) via = " (rank " + std::to_string(waited) + " is waiting for it too)";
  ErrorContext c = control_ != nullptr ? control_->with_peer(ctx, peer) : ctx;
  c.peer_rank = peer;
  c.elapsed_seconds = since(st.start);
  c.timeout_seconds = st.timeout;
  if (waited >= 0) c.transport = link_to(waited, ctx).caps().name;
  throw TimeoutError("no progress from rank " + std::to_string(peer) + " for " +
                         std::to_string(static_cast<int>(st.timeout)) + " s" + via +
                         " (the peer is stalled, overloaded or stuck before this collective)",
                     c);
}

// Throws when the control plane knows the collective cannot complete: a peer finalized before
// it, this process aborted, or the awaited peer is lost, dead or closed its control link.
void PlanRunner::check_peers(const State& st, int waited, double idle, const ErrorContext& ctx) {
  const std::uint64_t seq = static_cast<std::uint64_t>(ctx.seq);
  throw_if_finalized(seq, ctx);
  if (control_->gave_up()) {
    // Note [local abort] (control_plane.h): another thread of this process aborted.
    throw InvalidUsage("communicator aborted by this process while rank " +
                           std::to_string(ctx.rank) + " waited in " + ctx.op + " seq " +
                           std::to_string(seq) + ": " + control_->gave_up_reason(),
                       ctx);
  }
  if (waited < 0) return;
  if (control_->lost(waited)) throw_lost(st, waited, ctx);
  // Note [dead process]: only a wait without progress for a while looks (it reads /proc).
  if (idle >= ControlPlane::kProcessCheckSeconds && control_->process_gone(waited)) {
    ErrorContext c = control_->with_peer(ctx, waited);  // Note [dead process] (peer_info.cc)
    c.transport = link_to(waited, ctx).caps().name;
    c.elapsed_seconds = since(st.start);
    c.cause = FailureCause::kDied;
    throw PeerError(control_->gone_reason(waited) + "; this rank waited for it in " + ctx.op +
                        " seq " + std::to_string(seq), c);
  }
  // A peer whose control link closed may still have left its last bytes in shared memory: it is
  // dead only if the links were polled after the close was seen and nothing moved, so this is
  // checked before sleeping, never right after the poll that saw the close. A peer that
  // finalized after this collective completed it: its bytes are in the links (Note [finalize]).
  if (control_->closed(waited) && link_to(waited, ctx).wait_fd() < 0 &&
      control_->finalized_after(waited) <= static_cast<std::int64_t>(seq)) {
    ErrorContext c = control_->with_peer(ctx, waited);
    c.transport = link_to(waited, ctx).caps().name;
    c.cause = FailureCause::kDied;
    throw PeerError("rank " + std::to_string(waited) + " closed its control connection without "
                    "finalize() while this rank waited for it in " + ctx.op + " seq " +
                    std::to_string(seq) + ": it shut down before seq " + std::to_string(seq) +
                    " completed, or its process died or aborted", c);
  }
}

// Sleeps until `reader` may read or `writer` write (either may be null), at most `left` seconds
// and 100 ms, so the caller's deadline and the control plane are looked at again soon.
void PlanRunner::sleep_on_links(Link* reader, Link* writer, double left, const ErrorContext& ctx) {
  pollfd fds[2];
  int k = 0;
  Link* sleeper = nullptr;
  if (reader != nullptr) {
    if (reader->wait_fd() >= 0) {
      fds[k++] = {reader->wait_fd(), reader->wait_events(POLLIN), 0};
    } else {
      sleeper = reader;
    }
  }
  if (writer != nullptr) {
    if (writer->wait_fd() >= 0) {
      fds[k++] = {writer->wait_fd(), writer->wait_events(POLLOUT), 0};
    } else if (sleeper == nullptr) {
      sleeper = writer;
    }
  }
  if (sleeper != nullptr) {
    // Links without a descriptor (shared memory) sleep on their doorbell briefly, then the
    // control plane is looked at without waiting, so a dead peer is noticed within ~10 ms.
    sleeper->wait(std::min(left, 0.01), writer != nullptr, reader != nullptr);
    if (control_ != nullptr) control_->poll(fds, k, 0, ctx);
  } else if (control_ != nullptr) {
    // Data first: an abort only interrupts a rank that cannot make progress.
    control_->poll(fds, k, static_cast<int>(std::min(left * 1000.0 + 1, 100.0)), ctx);
  } else {
    ::poll(fds, static_cast<nfds_t>(k), static_cast<int>(std::min(left * 1000.0 + 1, 100.0)));
  }
}

// Note [stall warning]: the stall notice goes out before the first warning (at half the
// shorter of the warning interval and the timeout), so the warning of the ranks that wait behind
// this one can name whom it waits for.
void PlanRunner::watch_stall(State& st, std::uint64_t seq, int waited, double idle,
                             const ErrorContext& ctx) {
  const double warn = options_.stall_warn_seconds;
  const double notice_after = warn > 0 ? std::min(st.timeout, warn) / 2 : st.timeout / 2;
  if (control_ != nullptr && !st.notice_sent && idle > notice_after) {
    control_->send_stall_notice(seq, waited);
    st.notice_sent = true;
  }
  if (warn > 0 && idle >= warn * (st.warns + 1) && idle < st.timeout) {
    st.warns = static_cast<int>(idle / warn);
    warn_stall(seq, waited, idle, st.timeout, ctx);
  }
}

// Note [heartbeat]: a frozen peer closes nothing; its silence on the control link tells.
void PlanRunner::throw_lost(const State& st, int waited, const ErrorContext& ctx) {
  ErrorContext c = control_->with_peer(ctx, waited);
  c.transport = link_to(waited, ctx).caps().name;
  c.elapsed_seconds = since(st.start);
  c.cause = FailureCause::kStalled;
  throw PeerError(control_->lost_reason(waited) + "; this rank waited for it in " + ctx.op +
                      " seq " + std::to_string(ctx.seq),
                  c);
}

// Note [stall warning]: a wait without progress for MWMS_STALL_WARN_SECONDS (default min(30 s,
// timeout / 4)) logs one warning per interval at warn, naming the rank it waits for and, from
// the stall notices (Note [stall blame]), the rank that one waits for in turn, and how long ago
// the latter was last heard from (a live process that has not called the collective, or a
// frozen one: Note [heartbeat]). Horovod's stall inspector in spirit, without a coordinator:
// each rank names what it sees. Only slow waits pay for it (the clock is already read there).
void PlanRunner::warn_stall(std::uint64_t seq, int waited, double idle, double timeout,
                            const ErrorContext& ctx) const {
  if (!common::log_enabled(common::LogLevel::kWarn, common::LogSubsys::kColl)) return;
  std::string who =
      control_ != nullptr ? control_->name_of(waited) : "rank " + std::to_string(waited);
  int end = waited;
  if (control_ != nullptr) {
    end = control_->blame(waited);
    if (end != waited) who += ", which waits for " + control_->name_of(end);
    const double silent = control_->silent_seconds(end);
    char heard[160] = "";
    if (control_->closed(end)) {
      std::snprintf(heard, sizeof heard, "; rank %d closed its connections", end);
    } else if (silent >= 0) {
      const double lost_after = control_->lost_after(end);
      std::snprintf(heard, sizeof heard,
                    "; rank %d last heard from %.1f s ago (heartbeat every %g s, lost after %g s "
                    "of silence)",
                    end, silent, lost_after / ControlPlane::kLostIntervals, lost_after);
    }
    who += heard;
  }
  char head[96];
  std::snprintf(head, sizeof head, ": waiting %.1f s of %g s for ", idle, timeout);
  MWMS_LOG_WARN(kColl, "seq " << seq << " " << ctx.op << head << who
                              << " (MWMS_STALL_WARN_SECONDS)");
}

void PlanRunner::run(const Plan& plan, DataType dtype, ReduceOp op, int world_size,
                     double timeout_seconds, const ErrorContext& ctx) {
  State st;
  st.n = static_cast<int>(plan.transfers.size());
  st.dtype = dtype;
  st.op = op;
  st.world_size = world_size;
  st.timeout = timeout_seconds;
  st.progress = 1;  // the first wait reads the clock (Note [idle time])
  // Note [streaming copy-out]: the bytes this rank lands, against the cache they would fill.
  std::size_t landing_bytes = 0;
  for (const Transfer& t : plan.transfers) landing_bytes += t.recv_must_land ? t.recv_bytes : 0;
  const std::size_t stream_from = kernels::streaming_copy_min_bytes();
  st.stream_landing = stream_from > 0 && landing_bytes >= stream_from;
  st.s = next_with_send(plan, 0);
  st.r = next_with_recv(plan, 0);
  while (st.s < st.n || st.r < st.n) {
    bool progressed = pump_recv(plan, st, ctx);
    progressed = pump_send(plan, st, ctx) || progressed;
    if (progressed) {
      ++st.progress;
      st.force_partial = false;
      continue;
    }
    wait(plan, st, ctx);
  }
  if (st.notice_sent) control_->send_stall_notice(static_cast<std::uint64_t>(ctx.seq), -1);
}

}  // namespace mwms::collective
