// ParameterServerStrategy's request engine and training step. Each worker has one request in
// flight per ps: queue_segments() sends values or gradients from the variables (coalesced into
// one pack for small shards), on_message() receives the reply frame by frame into them, and run()
// drives every ps's request to its reply under the timeout (Note [message channel] in
// message_channel.h; the messages are Note [ps messages] in ps_protocol.h). pull() and
// apply_gradients() are one exchange each: a pull, or a push answered with the new values
// (synchronous or asynchronous: Note [ps serving] in ps_server.h). The state is
// parameter_server_strategy_impl.h.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <exception>
#include <string>

#include "collective/engine/message_channel.h"
#include "mwms/parameter_server.h"
#include "strategy/ps/parameter_server_strategy_impl.h"
#include "strategy/ps/ps_protocol.h"

namespace mwms {

namespace {

using collective::FrameHeader;
using strategy::ps::PsKind;
using strategy::ps::PsStatus;
using strategy::ps::Segment;
using strategy::ps::detail::since;

}  // namespace

void ParameterServerStrategy::Impl::queue_segments(PsLink& l, std::uint64_t seq, bool gradients) {
  for (std::size_t i = 0; i < l.layout.segments.size(); ++i) {
    const Segment& seg = l.layout.segments[i];
    const float* data;
    if (seg.pack) {
      float* pack = l.push_pack.data();
      for (std::size_t k = 0; k < l.shards.size(); ++k) {
        const VariableShard& s = *l.shards[k];
        if (l.layout.shard_offset[k] >= seg.count) continue;  // a large shard
        std::memcpy(pack + l.layout.shard_offset[k], gradients ? gradient_of(s) : value_of(s),
                    s.count * sizeof(float));
      }
      data = pack;
    } else {
      const VariableShard& s = *l.shards[seg.first_shard];
      data = gradients ? gradient_of(s) : value_of(s);
    }
    channel->queue_send(l.rank, strategy::ps::segment_header(l.layout, i, seq), data,
                        seg.count * sizeof(float));
  }
}

void ParameterServerStrategy::Impl::expect(PsLink& l, PsKind kind) {
  l.phase = PsLink::Phase::kHeader;
  l.failed = false;
  l.expect = kind;
  channel->start_recv(l.rank, nullptr, 0);
}

void ParameterServerStrategy::Impl::expect_segment(PsLink& l) {
  const Segment& seg = l.layout.segments[l.segment];
  float* dst = seg.pack ? l.pull_pack.data() : value_of(*l.shards[seg.first_shard]);
  channel->start_recv(l.rank, dst, seg.count * sizeof(float));
}

void ParameterServerStrategy::Impl::unpack(PsLink& l) {
  if (l.layout.segments.empty() || !l.layout.segments[0].pack) return;
  const std::size_t packed = l.layout.segments[0].count;
  for (std::size_t k = 0; k < l.shards.size(); ++k) {
    if (l.layout.shard_offset[k] >= packed) continue;
    std::memcpy(value_of(*l.shards[k]), l.pull_pack.data() + l.layout.shard_offset[k],
                l.shards[k]->count * sizeof(float));
  }
}

[[noreturn]] void ParameterServerStrategy::Impl::throw_failure(const PsLink& l,
                                                               const ErrorContext& c) {
  try {
    std::rethrow_exception(channel->failure(l.rank));
  } catch (const Error& e) {
    ErrorContext x = e.context();
    x.op = c.op;
    x.rank = c.rank;
    x.task = c.task;
    throw PeerError(l.name + " failed: " + e.message(), x);
  }
}

void ParameterServerStrategy::Impl::on_header(PsLink& l, const FrameHeader& h,
                                              const ErrorContext& pc) {
  if (h.kind == static_cast<std::uint8_t>(PsKind::kRefused) ||
      h.kind == static_cast<std::uint8_t>(PsKind::kFailed)) {
    if (h.count > strategy::ps::kMaxReasonBytes) {
      throw PeerError(l.name + " sent a refusal of " + std::to_string(h.count) + " bytes",
                      pc);
    }
    l.refused = h.kind == static_cast<std::uint8_t>(PsKind::kRefused);
    l.reason.assign(static_cast<std::size_t>(h.count), '\0');
    l.phase = PsLink::Phase::kReason;
    channel->start_recv(l.rank, l.reason.data(), l.reason.size());
    return;
  }
  const bool shared_reply = h.kind == static_cast<std::uint8_t>(PsKind::kSharedValues) &&
                            l.expect == PsKind::kValues && l.shared != nullptr;
  if (h.kind != static_cast<std::uint8_t>(l.expect) && !shared_reply) {
    throw PeerError(l.name + " answered " + collective::describe(h) + " where a " +
                        strategy::ps::kind_name(l.expect) + " reply was expected", pc);
  }
  l.version = h.seq;
  if (l.expect == PsKind::kReady) {
    if (h.count == 0) {  // replies will carry the values
      l.shared.reset();
      l.address.clear();
      l.phase = PsLink::Phase::kDone;
      return;
    }
    if (h.count > strategy::ps::kMaxSharedAddressBytes) {
      throw PeerError(
          l.name + " sent a shared-values address of " + std::to_string(h.count) + " bytes", pc);
    }
    l.reason.assign(static_cast<std::size_t>(h.count), '\0');
    l.phase = PsLink::Phase::kAddress;
    channel->start_recv(l.rank, l.reason.data(), l.reason.size());
    return;
  }
  if (l.expect == PsKind::kSaved) {
    if (h.count != strategy::ps::kSavedBytes) {
      throw PeerError(l.name + " sent a saved reply of " + std::to_string(h.count) +
                      " bytes", pc);
    }
    l.saved.assign(strategy::ps::kSavedBytes, '\0');
    l.phase = PsLink::Phase::kSaved;
    channel->start_recv(l.rank, l.saved.data(), l.saved.size());
    return;
  }
  if (h.count > static_cast<std::uint64_t>(PsStatus::kEnded)) {
    throw PeerError(l.name + " sent an unknown status " + std::to_string(h.count), pc);
  }
  l.status = static_cast<PsStatus>(h.count);
  l.segment = 0;
  if (shared_reply) {  // Note [ps shared values]: copied from the ps's values as they are final
    ++stats.shared_value_replies;
    l.copied = 0;
    l.phase = PsLink::Phase::kShared;
    copy_shared(l);
    return;
  }
  if (l.layout.segments.empty()) {
    l.phase = PsLink::Phase::kDone;
    return;
  }
  l.phase = PsLink::Phase::kSegments;
  expect_segment(l);
}

void ParameterServerStrategy::Impl::on_message(PsLink& l, const ErrorContext& c) {
  const FrameHeader& h = channel->recv_header(l.rank);
  const ErrorContext pc = channel->with_peer(c, l.rank);
  switch (l.phase) {
    case PsLink::Phase::kHeader:
      on_header(l, h, pc);
      return;
    case PsLink::Phase::kReason:
      if (l.refused) {
        throw CollectiveMismatchError(l.name + " refused this worker: " + l.reason, pc);
      }
      l.failed = true;
      l.phase = PsLink::Phase::kDone;
      return;
    case PsLink::Phase::kSaved:
      l.phase = PsLink::Phase::kDone;
      return;
    case PsLink::Phase::kAddress:
      if (l.shared == nullptr || l.address != l.reason) {
        try {
          l.shared = strategy::ps::SharedValues::open(l.reason, l.layout.total);
        } catch (const BootstrapError& e) {
          throw BootstrapError(l.name + ": " + e.message(), pc);
        }
        l.address = l.reason;
      }
      l.phase = PsLink::Phase::kDone;
      return;
    case PsLink::Phase::kSegments:
      strategy::ps::check_segment(h, l.layout, l.segment, l.version, pc);
      if (++l.segment < l.layout.segments.size()) {
        expect_segment(l);
        return;
      }
      unpack(l);
      l.phase = PsLink::Phase::kDone;
      return;
    case PsLink::Phase::kIdle:
    case PsLink::Phase::kShared:  // run() copies it (copy_shared): nothing arrives meanwhile
    case PsLink::Phase::kDone:
      return;
  }
}

bool ParameterServerStrategy::Impl::copy_shared(PsLink& l) {
  const std::size_t total = l.layout.total;
  const std::size_t ready = l.shared->ready();
  if (ready < l.copied) {
    // The ps started its next update under this copy: it gave up on this worker (Note [ps
    // shared values]: a reader it judged frozen); what was copied is not one version.
    throw PeerError(l.name +
                        " changed its shared values while this worker copied them (it "
                        "dropped this worker as too slow)",
                    channel->with_peer(ctx("ps pull"), l.rank));
  }
  bool moved = false;
  if (ready > l.copied) {
    const float* src = l.shared->data();
    for (std::size_t k = 0; k < l.shards.size(); ++k) {
      const std::size_t off = l.layout.shard_offset[k];
      const std::size_t lo = std::max(off, l.copied);
      const std::size_t hi = std::min(off + l.shards[k]->count, ready);
      if (lo < hi) {
        std::memcpy(value_of(*l.shards[k]) + (lo - off), src + lo, (hi - lo) * sizeof(float));
      }
    }
    l.copied = ready;
    moved = true;
  }
  if (l.copied < total) return moved;
  channel->queue_send(l.rank, strategy::ps::envelope(PsKind::kCopied, l.version), nullptr, 0);
  l.phase = PsLink::Phase::kDone;
  return true;
}

void ParameterServerStrategy::Impl::run(const char* op, const char* waiting_for) {
  const ErrorContext c = ctx(op);
  auto last = common::Clock::now();
  for (;;) {
    bool moved = channel->pump(c);
    bool all = true;
    bool copying = false;
    for (PsLink& l : links) {
      if (channel->failed(l.rank)) throw_failure(l, c);
      if (l.phase == PsLink::Phase::kShared) {
        moved = copy_shared(l) || moved;
      } else if (l.phase != PsLink::Phase::kDone && channel->recv_done(l.rank)) {
        on_message(l, c);
      }
      copying = copying || l.phase == PsLink::Phase::kShared;
      all = all && l.phase == PsLink::Phase::kDone;
    }
    if (all) {
      bool idle = true;
      for (const PsLink& l : links) idle = idle && channel->sends_idle(l.rank);
      if (idle) return;
    }
    if (moved) {
      last = common::Clock::now();
      continue;
    }
    if (since(last) > timeout) {
      for (const PsLink& l : links) {
        if (l.phase == PsLink::Phase::kDone) continue;
        ErrorContext x = channel->with_peer(c, l.rank);
        x.elapsed_seconds = since(last);
        throw TimeoutError("no reply from " + l.name + " for " +
                               std::to_string(static_cast<int>(timeout)) + " s in " + op +
                               " (" + waiting_for + ")",
                           x);
      }
    }
    // The ps publishes a shared reply's progress in its memory, not on the link: look again soon.
    channel->wait(copying ? 0.0002 : 0.05, c);
  }
}

void ParameterServerStrategy::Impl::exchange(PsKind request, PsKind reply, const char* op,
                                             const char* why) {
  for (PsLink& l : links) {
    const std::uint64_t seq = request == PsKind::kPush ? l.version : 0;
    channel->queue_send(l.rank, strategy::ps::envelope(request, seq), nullptr, 0);
    if (request == PsKind::kPush) queue_segments(l, l.version, true);
    expect(l, reply);
  }
  run(op, why);
}

void ParameterServerStrategy::Impl::finish_values() {
  global_step = static_cast<std::int64_t>(links[0].version);
  stats.global_step = global_step;
  bool dropped = false;
  for (std::size_t p = 0; p < links.size(); ++p) {
    stats.bytes_pulled[p] += links[p].layout.total * sizeof(float);
    stop = stop || links[p].status == PsStatus::kEnded;
    dropped = dropped || links[p].status == PsStatus::kDropped;
  }
  if (dropped) ++stats.dropped_stale;
}

std::int64_t ParameterServerStrategy::pull() {
  Impl& m = *impl_;
  if (!m.initialized || m.finalized) throw InvalidUsage("pull() before initialize() or after finalize()");
  m.exchange(PsKind::kPull, PsKind::kValues, "ps pull", "the ps sends the variables");
  m.finish_values();
  return m.global_step;
}

std::int64_t ParameterServerStrategy::apply_gradients() {
  Impl& m = *impl_;
  if (!m.initialized || m.finalized) {
    throw InvalidUsage("apply_gradients() before initialize() or after finalize()");
  }
  if (m.stop) throw InvalidUsage("apply_gradients() after the chief ended the job (should_stop)");
  m.exchange(PsKind::kPush, PsKind::kValues, "ps push",
             m.options.sync_replicas
                 ? "synchronous mode: the ps completes a global step once replicas_to_aggregate "
                   "workers pushed it"
                 : "asynchronous mode: the ps applies the gradient, or holds the reply while "
                   "this worker is max_staleness pushes ahead of the slowest");
  ++m.stats.pushes;
  for (std::size_t p = 0; p < m.links.size(); ++p) {
    m.stats.bytes_pushed[p] += m.links[p].layout.total * sizeof(float);
  }
  m.finish_values();
  return m.global_step;
}

}  // namespace mwms
