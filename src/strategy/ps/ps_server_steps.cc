// A parameter server's pushes and pulls (Note [ps serving] in ps_server.h): the optimizer on a
// range of the ps's buffer, the receive sink that consumes a push straight from the link and the
// line of pushes waiting to stream (Note [ps streamed apply], below), the synchronous step that
// applies the mean of replicas_to_aggregate gradients with every held reply let out behind it
// (Note [ps step pipeline]), dropped steps, and the asynchronous max_staleness holds. The state
// is ps_server_state.h; the loop that calls these is ps_server.cc.
#include <algorithm>
#include <cstring>
#include <string>

#include "common/logging.h"
#include "mwms/optimizer.h"
#include "strategy/ps/ps_server_state.h"

namespace mwms::strategy::ps {

namespace {

using collective::FrameHeader;
using detail::kStalenessBuckets;
using detail::Worker;

// The mean of n gradients is their sum / n, and every worker of the all-reduce strategy divides
// the same way (the weights are compared bit for bit). When n is a power of two, 1/n is exact in
// float and x * (1/n) is the same correctly rounded value as x / n for every x (subnormals and
// NaNs included), so the multiply, several times cheaper than a divide, is taken instead.
struct MeanScale {
  bool by_multiply = false;
  float factor = 1;   // 1/n, when by_multiply
  float divisor = 1;  // n
};

MeanScale mean_scale(int n) {
  MeanScale m;
  m.divisor = static_cast<float>(n);
  m.by_multiply = n > 0 && (n & (n - 1)) == 0;
  m.factor = 1.0f / m.divisor;
  return m;
}

void divide(float* a, std::size_t n, const MeanScale& m) {
  if (m.by_multiply) {
    for (std::size_t i = 0; i < n; ++i) a[i] *= m.factor;
  } else {
    for (std::size_t i = 0; i < n; ++i) a[i] /= m.divisor;
  }
}

}  // namespace

void PsServer::State::ApplySink::on_envelope(const FrameHeader& h) {
  Worker& w = *st.streaming;
  check_segment(h, st.layout, w.segment, w.version, st.peer_ctx(w, "ps push"));
}

void PsServer::State::ApplySink::consume(std::size_t offset, const char* data, std::size_t bytes) {
  Worker& w = *st.streaming;
  const Segment& seg = st.layout.segments[w.segment];
  const std::size_t first = seg.element_offset + offset / sizeof(float);
  const std::size_t count = bytes / sizeof(float);
  if (st.job.sync_replicas) {
    float* a = st.accum.data() + first;
    if (st.fused) {
      st.fused_range(first, a, reinterpret_cast<const float*>(data), count);
      // Final for this version: every reply may carry these bytes now (Note [ps fused step]).
      st.values.publish(first + count);
      for (Worker& x : st.workers) {
        if (awaits_values(x) || &x == &w) st.let_out(x, w.segment, offset + bytes);
      }
      return;
    }
    if (st.streaming_first) {
      std::memcpy(a, data, count * sizeof(float));
    } else {
      const float* g = reinterpret_cast<const float*>(data);
      for (std::size_t i = 0; i < count; ++i) a[i] += g[i];
    }
    return;
  }
  st.apply_range(first, reinterpret_cast<const float*>(data), count);
  // These values are final for this version: the reply may carry them now.
  st.values.publish(first + count);
  if (w.reply_streamed) st.let_out(w, w.segment, offset + bytes);
}

void PsServer::State::apply_range(std::size_t first, const float* grad, std::size_t count) {
  for (std::size_t k = 0; k < slots.size(); ++k) slot_ptrs[k] = slots[k].data() + first;
  apply_gradient(optimizer, values.data() + first, grad, slot_ptrs.data(), count,
                 static_cast<std::int64_t>(version));
}

void PsServer::State::apply(const float* grad) {
  begin_update();
  ++version;
  apply_range(0, grad, layout.total);
  values.publish(layout.total);
  stats.global_step = static_cast<std::int64_t>(version);
}

// Note [ps streamed apply]: a push is consumed as its bytes arrive, straight from the link (a
// shared-memory ring: the gradient is never copied into `grad`), instead of being received whole
// and consumed in a second pass; one push streams at a time, the others wait in line (FIFO) with
// their bytes still in the link.
// - Asynchronous: the push is applied as it arrives. Applying changes `values`, which replies are
//   sent from (Note [ps serving]), so it starts only once no reply is in flight, and until it
//   ends every other reply and save is deferred. Its reply (without max_staleness: kApplied at
//   the new version) is queued when it starts and let out segment by segment as the update
//   reaches it, overlapping the push. The version and staleness are taken when it starts. A
//   worker lost mid-push leaves the part of its gradient that arrived applied: asynchronous
//   training tolerates a partial stale update as it tolerates a stale one.
// - Synchronous: a push of the current version is summed into `accum` as it arrives (the first
//   one copied); the step completes only between pushes. A worker lost mid-push leaves a partial
//   sum, so that step's gradients are dropped (kDropped: the workers compute them again on the
//   same version) rather than applied.
void PsServer::State::start_streaming(Worker& w) {
  streaming = &w;
  w.streamed = true;
  if (job.sync_replicas) {
    streaming_first = accumulated == 0;
    if (accumulated + 1 >= step_needs()) begin_fused_step(w);
    return;
  }
  begin_update();
  const std::uint64_t stale = version - w.version;
  ++stats.staleness_histogram[std::min<std::size_t>(stale, kStalenessBuckets - 1)];
  ++version;
  stats.global_step = static_cast<std::int64_t>(version);
  w.reply_streamed = job.max_staleness < 0;
  if (w.reply_streamed) queue_values(w, PsStatus::kApplied, true);
}

// The streamed push is complete (or its worker lost): deferred replies and saves go out. The
// next push in line starts with start_next_push(), once the caller has accounted for this one.
void PsServer::State::end_streaming() {
  if (streaming == nullptr) return;
  // Whole (or all there will be, when its worker was lost mid-push): Note [ps shared values].
  values.publish(layout.total);
  streaming->streamed = false;
  streaming->reply_streamed = false;
  streaming = nullptr;
  for (Worker& x : workers) {
    if (x.lost) continue;
    if (x.reply_deferred) {
      x.reply_deferred = false;
      send_values(x, x.deferred_status);
    }
    if (x.save_deferred) {
      x.save_deferred = false;
      on_save(x);
    }
  }
}

void PsServer::State::start_next_push() {
  if (streaming != nullptr) return;
  Worker* next = nullptr;
  for (Worker& x : workers) {
    if (x.lost || x.push_waiting == 0) continue;
    if (next == nullptr || x.push_waiting < next->push_waiting) next = &x;
  }
  if (next == nullptr) return;
  next->push_waiting = 0;
  next->phase = Phase::kPushData;
  // A synchronous push that a completed step made stale lands in `grad` and is dropped.
  if (!ended && (!job.sync_replicas || next->version == version)) start_streaming(*next);
  expect_segment(*next, next->grad.data());
}

// Synchronous: the sum of this step is lost (Note [ps streamed apply]); every held gradient is
// dropped and its worker computes it again on the same version.
void PsServer::State::drop_step(const char* why) {
  if (accumulated == 0) return;  // only the lost push's own partial sum, overwritten next
  MWMS_LOG_WARN(kStrat, "ps " << cfg.ps_index << ": dropped step " << version << "'s "
                              << accumulated << " gradient(s): " << why);
  stats.dropped_stale += accumulated;
  accumulated = 0;
  for (Worker& x : workers) {
    if (!awaits_values(x)) continue;
    send_values(x, PsStatus::kDropped);
    expect_request(x);
  }
}

void PsServer::State::on_pull_or_push(Worker& w, const FrameHeader& h, const ErrorContext& c) {
  if (!initialized || !w.joined) {
    refuse(w, std::string(kind_name(w.request)) + " before the variables were initialized");
    return;
  }
  if (w.request == PsKind::kPull) {
    send_values(w, ended ? PsStatus::kEnded : PsStatus::kApplied);
    expect_request(w);
    return;
  }
  if (h.seq > version) {
    throw PeerError("pushed a gradient of version " + std::to_string(h.seq) +
                    ", newer than this ps's " + std::to_string(version), c);
  }
  w.version = h.seq;
  w.segment = 0;
  ++stats.pushes;
  stats.bytes_pushed[0] += bytes();
  if (layout.segments.empty()) {
    on_push(w);
    return;
  }
  if (!ended && streaming != nullptr) {
    w.phase = Phase::kHeld;  // Note [ps streamed apply]: streams after the one running
    w.push_waiting = ++line;
    return;
  }
  w.phase = Phase::kPushData;
  if (!ended && (!job.sync_replicas || w.version == version)) start_streaming(w);
  expect_segment(w, w.grad.data());
}

void PsServer::State::on_push(Worker& w) {
  const bool streamed = w.streamed;
  const bool replied = w.reply_streamed;
  // Only the push that streams ends the stream: one received whole (made stale by a completed
  // step, or after the job ended) may complete while the next push streams.
  if (streamed) end_streaming();
  if (fused && streamed) {  // Note [ps fused step]: applied and replied as it arrived
    end_fused_step(w);
    return;
  }
  if (ended) {
    // An asynchronous push that streamed from before the end is applied; any other is not.
    if (streamed && !job.sync_replicas) {
      ++stats.applied;
    } else {
      ++stats.after_end;
    }
    if (!replied) send_values(w, PsStatus::kEnded);
    expect_request(w);
    start_next_push();
    return;
  }
  if (job.sync_replicas) {
    if (w.version < version) {
      ++stats.dropped_stale;  // SyncReplicasOptimizer drops gradients of older steps
      send_values(w, PsStatus::kDropped);
      expect_request(w);
      start_next_push();
      return;
    }
    if (!streamed && accumulated == 0) {
      std::memcpy(accum.data(), w.grad.data(), accum.size() * sizeof(float));
    } else if (!streamed) {
      const float* g = w.grad.data();
      float* a = accum.data();
      for (std::size_t i = 0; i < accum.size(); ++i) a[i] += g[i];
    }
    streaming_first = false;
    ++accumulated;
    ++stats.staleness_histogram[0];
    w.phase = Phase::kHeld;
    maybe_complete_step();
    start_next_push();
    return;
  }
  if (streamed) {
    ++stats.applied;
    ++w.clock;
    if (replied) {
      expect_request(w);
    } else {
      w.phase = Phase::kHeld;
      release_held();
      if (w.phase == Phase::kHeld) ++stats.held_back;  // max_staleness: ahead of the slowest
    }
    start_next_push();
    return;
  }
  const std::uint64_t stale = version - w.version;
  ++stats.staleness_histogram[std::min<std::size_t>(stale, kStalenessBuckets - 1)];
  apply(w.grad.data());
  ++stats.applied;
  ++w.clock;
  w.phase = Phase::kHeld;
  release_held();
  if (w.phase == Phase::kHeld) ++stats.held_back;  // max_staleness: ahead of the slowest
}

// Synchronous: Note [ps serving].
void PsServer::State::maybe_complete_step() {
  if (accumulated == 0 || streaming != nullptr) return;  // a step completes between pushes
  const int need = std::max(1, std::min(job.replicas_to_aggregate, live()));
  if (accumulated < need) return;
  const MeanScale mean = mean_scale(accumulated);
  stats.applied += accumulated;
  accumulated = 0;
  begin_update();
  ++version;
  stats.global_step = static_cast<std::int64_t>(version);
  // Note [ps step pipeline]: every held reply is queued now and let out chunk by chunk as the
  // update reaches it, so the workers copy the first values while the ps updates the rest (and
  // the ps's link copies each chunk while it is still in this core's cache).
  for (Worker& x : workers) {
    if (awaits_values(x)) queue_values(x, PsStatus::kApplied, true);
  }
  const ErrorContext c = ctx("ps step");
  constexpr std::size_t kChunk = 16384;  // elements: 64 KiB of values, slots and accum
  std::size_t segment = 0;
  for (std::size_t first = 0; first < layout.total; first += kChunk) {
    const std::size_t n = std::min(kChunk, layout.total - first);
    float* a = accum.data() + first;
    divide(a, n, mean);  // ConditionalAccumulator.take_grad: mean
    apply_range(first, a, n);
    const std::size_t done = first + n;
    values.publish(done);
    while (segment < layout.segments.size()) {
      const Segment& sg = layout.segments[segment];
      const std::size_t upto = std::min(done, sg.element_offset + sg.count);
      for (Worker& x : workers) {
        if (awaits_values(x)) let_out(x, segment, (upto - sg.element_offset) * sizeof(float));
      }
      if (upto < sg.element_offset + sg.count) break;
      ++segment;
    }
    ch.pump(c);
  }
  for (Worker& x : workers) {
    if (awaits_values(x)) expect_request(x);
  }
}

// Note [ps fused step]: in synchronous mode the push that brings the step's last gradient (the
// replicas_to_aggregate-th, or the last live worker's) is not summed into `accum` and applied in
// a second pass once it has arrived: each range is summed, averaged and applied as it arrives
// (one pass over accum, values and slots instead of three), and every held reply, the pushing
// worker's own included, is let out behind it, so the update and the replies overlap the push.
// The arithmetic is the unfused one's, (sum + g) / n with the same division, so the weights stay
// bit-equal to the all-reduce strategy's. begin_fused_step() advances the version before the
// first byte is applied, so no reply or save may read `values` until the push ends
// (values_changing()). One thing differs from the unfused step: a worker lost in the middle of
// that push cannot have its step dropped, since part of the update is applied already; the rest
// of the buffer then gets the mean of the other gradients of the step (none: left as it is), the
// step counts them only, and the replies go out as after any step. Training tolerates such a
// step as asynchronous mode tolerates a partial stale update.
void PsServer::State::begin_fused_step(Worker& w) {
  begin_update();  // Note [ps serving]: no reply of the last version still reads `values`
  fused = true;
  fused_count = accumulated + 1;
  fused_done = 0;
  ++version;
  stats.global_step = static_cast<std::int64_t>(version);
  for (Worker& x : workers) {
    if (awaits_values(x)) queue_values(x, PsStatus::kApplied, true);
  }
  queue_values(w, PsStatus::kApplied, true);
  w.reply_streamed = true;
}

void PsServer::State::fused_range(std::size_t first, const float* a, const float* g,
                                  std::size_t count) {
  fused_done = first + count;
  if (streaming_first && fused_count == 1) {  // the mean of one gradient: apply it from the link
    apply_range(first, g, count);
    return;
  }
  // ConditionalAccumulator.take_grad's mean, as maybe_complete_step() takes it: sum, then / n,
  // into a block on the stack that stays in L1 for the optimizer: `accum` is not written back,
  // which saves a pass over it (the lost-worker path reads accum only past fused_done).
  constexpr std::size_t kBlock = 1024;
  float mean[kBlock];
  const MeanScale m = mean_scale(fused_count);
  for (std::size_t k = 0; k < count; k += kBlock) {
    const std::size_t n = std::min(kBlock, count - k);
    const float* gk = g + k;
    if (streaming_first) {
      for (std::size_t i = 0; i < n; ++i) mean[i] = gk[i];
    } else {
      const float* ak = a + k;
      for (std::size_t i = 0; i < n; ++i) mean[i] = ak[i] + gk[i];
    }
    divide(mean, n, m);
    apply_range(first + k, mean, n);
  }
}

void PsServer::State::end_fused_step(Worker& w) {
  fused = false;
  stats.applied += fused_count;
  stats.staleness_histogram[0] += 1;
  accumulated = 0;
  streaming_first = false;
  for (Worker& x : workers) {
    if (awaits_values(x)) expect_request(x);
  }
  expect_request(w);
  start_next_push();
}

void PsServer::State::finish_fused_step_without(Worker& lost) {
  const int others = fused_count - 1;
  MWMS_LOG_WARN(kStrat, "ps " << cfg.ps_index << ": lost " << lost.name << " in the middle of "
                              << "the push that completes step " << version << "; its rest "
                              << "gets the mean of the step's other " << others
                              << " gradient(s) (Note [ps fused step])");
  const ErrorContext c = ctx("ps step");
  constexpr std::size_t kChunk = 16384;
  for (std::size_t first = fused_done; first < layout.total && others > 0; first += kChunk) {
    const std::size_t n = std::min(kChunk, layout.total - first);
    float* a = accum.data() + first;
    divide(a, n, mean_scale(others));
    apply_range(first, a, n);
  }
  values.publish(layout.total);
  fused = false;
  stats.applied += others;
  accumulated = 0;
  streaming_first = false;
  for (Worker& x : workers) {
    if (!awaits_values(x)) continue;
    for (std::size_t i = 0; i < layout.segments.size(); ++i) {
      let_out(x, i, layout.segments[i].count * sizeof(float));
    }
    expect_request(x);
  }
  ch.pump(c);
}

// Asynchronous: replies held by max_staleness (stale-synchronous parallel) go out once the
// slowest live worker is within the bound.
void PsServer::State::release_held() {
  std::int64_t slowest = -1;
  for (const Worker& x : workers) {
    if (x.bye || x.lost || !x.joined) continue;
    slowest = slowest < 0 ? x.clock : std::min(slowest, x.clock);
  }
  for (Worker& x : workers) {
    if (!awaits_values(x)) continue;
    if (!ended && job.max_staleness >= 0 && slowest >= 0 &&
        x.clock - slowest > job.max_staleness) {
      continue;
    }
    send_values(x, ended ? PsStatus::kEnded : PsStatus::kApplied);
    expect_request(x);
  }
}

}  // namespace mwms::strategy::ps
