// One parameter server's message loop (Note [ps serving] in ps_server.h): serve() pumps the
// channel and hands each worker's completed receive to on_message, which dispatches a request by
// kind (push and pull to ps_server_steps.cc, init/join/save/restore to ps_server_admin.cc) or a
// received segment; the replies every request shares (values, ready, refusal, failure) and the
// drain that keeps an update from overlapping a reply in flight; and the failure checks that
// drop a lost worker (or end the job when the chief is lost). The state is ps_server_state.h.
#include "strategy/ps/ps_server.h"

#include <chrono>
#include <exception>
#include <string>
#include <utility>

#include "common/logging.h"
#include "strategy/ps/ps_server_state.h"

namespace mwms::strategy::ps {

namespace {

using collective::FrameHeader;
using collective::MessageChannel;
using detail::kStalenessBuckets;
using detail::Worker;

}  // namespace

void PsServer::State::send_values(Worker& w, PsStatus status) {
  if (values_changing()) {  // Note [ps streamed apply]
    w.reply_deferred = true;
    w.deferred_status = status;
    return;
  }
  queue_values(w, status, false);
}

void PsServer::State::queue_values(Worker& w, PsStatus status, bool gated) {
  if (w.mapped) {  // Note [ps shared values]: it copies them from `values` itself
    ch.queue_send(
        w.rank,
        envelope(PsKind::kSharedValues, version, static_cast<std::uint64_t>(status), cfg.ps_index),
        nullptr, 0);
    w.reading = true;
    ++stats.shared_value_replies;
    stats.bytes_pulled[0] += bytes();
    return;
  }
  ch.queue_send(w.rank, envelope(PsKind::kValues, version, static_cast<std::uint64_t>(status),
                                 cfg.ps_index),
                nullptr, 0);
  for (std::size_t i = 0; i < layout.segments.size(); ++i) {
    const Segment& s = layout.segments[i];
    const std::size_t n = s.count * sizeof(float);
    w.tickets[i] = ch.queue_send(w.rank, segment_header(layout, i, version),
                                 values.data() + s.element_offset, n, gated ? 0 : n);
  }
  stats.bytes_pulled[0] += bytes();
}

void PsServer::State::send_ready(Worker& w) {
  w.joined = true;
  w.mapped = w.shm && values.shared != nullptr;
  w.address = w.mapped ? values.shared->address() : std::string();
  ch.queue_send(w.rank, envelope(PsKind::kReady, version, w.address.size(), cfg.ps_index), nullptr,
                0);
  if (!w.mapped) return;
  MWMS_LOG_INFO(kStrat,
                "ps " << cfg.ps_index << ": " << w.name << " reads the values from shared memory");
  ch.queue_send(w.rank, envelope(PsKind::kData, version, w.address.size(), cfg.ps_index),
                w.address.data(), w.address.size());
}

void PsServer::State::send_reason(Worker& w, PsKind kind, std::string reason) {
  w.refusal = std::move(reason);
  if (w.refusal.size() > kMaxReasonBytes) w.refusal.resize(kMaxReasonBytes);
  ch.queue_send(w.rank, envelope(kind, version, w.refusal.size(), cfg.ps_index), nullptr, 0);
  ch.queue_send(w.rank, envelope(PsKind::kData, version, w.refusal.size(), cfg.ps_index),
                w.refusal.data(), w.refusal.size());
}

void PsServer::State::refuse(Worker& w, std::string reason) {
  MWMS_LOG_WARN(kStrat, "ps " << cfg.ps_index << ": refused " << w.name << ": " << reason);
  send_reason(w, PsKind::kRefused, std::move(reason));
  w.phase = Phase::kGone;
}

void PsServer::State::fail_request(Worker& w, std::string reason) {
  MWMS_LOG_WARN(kStrat, "ps " << cfg.ps_index << ": " << kind_name(w.request) << " for "
                              << w.name << " failed: " << reason);
  send_reason(w, PsKind::kFailed, std::move(reason));
  expect_request(w);
}

void PsServer::State::drain_sends() {
  const ErrorContext c = ctx("ps reply");
  auto busy = [&] {
    for (const Worker& w : workers) {
      if (!w.lost && !ch.failed(w.rank) && !ch.retired(w.rank) && !ch.sends_idle(w.rank)) {
        return true;
      }
    }
    return false;
  };
  while (busy()) {
    if (!ch.pump(c)) ch.wait(0.01, c);
  }
}

void PsServer::State::on_copied(Worker& w, const FrameHeader& h, const ErrorContext& c) {
  if (!w.reading || h.seq > version) {
    throw PeerError("said it copied version " + std::to_string(h.seq) +
                        " of the shared values "
                        "without a reply to copy",
                    c);
  }
  w.reading = false;
  expect_request(w);
}

// Note [ps shared values]: every live reader is waited for (its kCopied is the next message on
// its link); one that dies or is lost meanwhile fails its link (heartbeat, death checks in
// wait) and is no longer waited for.
void PsServer::State::begin_update() {
  drain_sends();
  const ErrorContext c = ctx("ps update (waiting for a worker's copy of the shared values)");
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    bool waiting = false;
    // Half the timeout: the workers waiting for this update count theirs from a little earlier,
    // and must see it go on without the frozen reader rather than time out themselves.
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const bool late = waited > cfg.timeout_seconds / 2;
    for (Worker& x : workers) {
      if (!x.reading || x.lost || ch.failed(x.rank) || ch.retired(x.rank)) continue;
      if (x.phase != Phase::kRequest || !ch.recv_done(x.rank)) {
        if (late) {  // alive but not copying: dropped as a frozen worker is
          ErrorContext xc = peer_ctx(x, "ps update");
          xc.elapsed_seconds = waited;
          ch.fail(x.rank, std::make_exception_ptr(
                              TimeoutError("did not finish copying the shared values in " +
                                               std::to_string(static_cast<int>(waited)) + " s",
                                           xc)));
          continue;
        }
        waiting = true;
        continue;
      }
      const FrameHeader& h = ch.recv_header(x.rank);
      if (h.kind == static_cast<std::uint8_t>(PsKind::kBye) && h.payload_bytes == 0) {
        x.reading = false;  // a copy cut short (another ps failed), then finalize(): goodbye
        on_request(x);
        continue;
      }
      if (h.kind != static_cast<std::uint8_t>(PsKind::kCopied) || h.payload_bytes != 0) {
        ch.fail(x.rank, std::make_exception_ptr(PeerError("sent " + collective::describe(h) +
                                                              " before saying it copied the "
                                                              "shared values",
                                                          peer_ctx(x, "ps update"))));
        continue;
      }
      x.reading = false;
      expect_request(x);
    }
    if (!waiting) break;
    if (!ch.pump(c)) ch.wait(0.001, c);
  }
  values.reset();
}

PsServer::PsServer(MessageChannel& channel, ServerConfig config)
    : st_(std::make_unique<State>(channel, std::move(config))) {}
PsServer::~PsServer() = default;

void PsServer::State::on_request(Worker& w) {
  const FrameHeader& h = ch.recv_header(w.rank);
  const ErrorContext c = peer_ctx(w, "ps request");
  if (!is_ps_kind(h.kind) || h.payload_bytes != 0) {
    throw PeerError("not a parameter-server request: " + collective::describe(h), c);
  }
  w.request = static_cast<PsKind>(h.kind);
  switch (w.request) {
    case PsKind::kInit:
    case PsKind::kJoin:
      on_description_request(w, h, c);
      return;
    case PsKind::kSave:
    case PsKind::kRestore:
      on_checkpoint_request(w, h, c);
      return;
    case PsKind::kPush:
    case PsKind::kPull:
      on_pull_or_push(w, h, c);
      return;
    case PsKind::kCopied:
      on_copied(w, h, c);
      return;
    case PsKind::kBye:
      w.bye = true;
      w.phase = Phase::kGone;
      if (w.rank == cfg.chief && h.count == 1 && !ended) {
        ended = true;
        stats.after_end += static_cast<std::int64_t>(accumulated);  // a step never completed
      }
      ch.retire(w.rank);
      MWMS_LOG_INFO(kStrat, "ps " << cfg.ps_index << ": " << w.name << " said goodbye"
                                  << (h.count == 1 ? " and ended the job" : ""));
      return;
    default:
      throw PeerError(std::string("unexpected ") + kind_name(w.request) + " request", c);
  }
}

void PsServer::State::on_message(Worker& w) {
  switch (w.phase) {
    case Phase::kRequest:
      on_request(w);
      return;
    case Phase::kDescription:
      on_description(w);
      return;
    case Phase::kInitValues:
    case Phase::kPushData: {
      const bool init = w.phase == Phase::kInitValues;
      check_segment(ch.recv_header(w.rank), layout, w.segment, init ? 0 : w.version,
                    peer_ctx(w, init ? "ps init" : "ps push"));
      if (++w.segment < layout.segments.size()) {
        expect_segment(w, init ? values.data() : w.grad.data());
        return;
      }
      if (!init) {
        on_push(w);
        return;
      }
      initialized = true;
      send_ready(w);
      expect_request(w);
      answer_waiting_joins();
      return;
    }
    case Phase::kHeld:
    case Phase::kGone:
      return;
  }
}

void PsServer::State::check_failures() {
  bool changed = false;
  for (Worker& w : workers) {
    if (w.lost || w.bye || !ch.failed(w.rank)) continue;
    w.lost = true;
    w.phase = Phase::kGone;
    changed = true;
    if (streaming == &w) {
      // Note [ps fused step]: the step is finished without the rest of its gradient.
      const bool was_fused = fused;
      if (was_fused) finish_fused_step_without(w);
      end_streaming();
      // Asynchronous: what arrived of its gradient stays applied. Synchronous: the sum is partial.
      if (job.sync_replicas && !was_fused) {
        drop_step(("lost " + w.name + " in the middle of its push").c_str());
      }
      streaming_first = false;
      start_next_push();
    }
    std::string why;
    try {
      std::rethrow_exception(ch.failure(w.rank));
    } catch (const Error& e) {
      why = e.message();
    } catch (...) {
      why = "unknown error";
    }
    if (w.rank == cfg.chief && !ended) {
      const std::string reason = "ps " + std::to_string(cfg.ps_index) + " lost the chief (" +
                                 w.name + "): " + why;
      if (ch.control() != nullptr) {
        ch.control()->send_abort(w.rank, reason, collective::AbortCause::kPeer,
                                 FailureCause::kDied);
      }
      ErrorContext c = peer_ctx(w, "ps serve");
      c.cause = FailureCause::kDied;
      throw PeerError(reason, c);
    }
    stats.lost_workers.push_back(w.name);
    MWMS_LOG_WARN(kStrat, "ps " << cfg.ps_index << ": lost " << w.name << ": " << why << "; "
                                << live() << " worker(s) left, training continues");
  }
  if (!changed) return;
  if (live() == 0 && !ended) {
    throw PeerError("ps " + std::to_string(cfg.ps_index) + " lost every worker",
                    ctx("ps serve"));
  }
  if (job.sync_replicas) {
    maybe_complete_step();
  } else {
    release_held();
  }
}

bool PsServer::State::done() const {
  if (!ended) return false;
  for (const Worker& w : workers) {
    if (!w.bye && !w.lost) return false;
  }
  return true;
}

ParameterServerStats PsServer::serve() {
  State& s = *st_;
  s.stats.staleness_histogram.assign(kStalenessBuckets, 0);
  s.stats.bytes_pushed.assign(1, 0);
  s.stats.bytes_pulled.assign(1, 0);
  for (std::size_t i = 0; i < s.cfg.workers.size(); ++i) {
    Worker w;
    w.rank = s.cfg.workers[i];
    w.name = s.cfg.worker_names[i];
    w.shm = i < s.cfg.worker_shm.size() && s.cfg.worker_shm[i] != 0;
    s.workers.push_back(std::move(w));
  }
  for (Worker& w : s.workers) s.expect_request(w);
  const ErrorContext c = s.ctx("ps serve");
  while (!s.done()) {
    const bool moved = s.ch.pump(c);
    for (Worker& w : s.workers) {
      if (w.lost || w.bye || s.ch.failed(w.rank) || !s.ch.recv_done(w.rank)) continue;
      try {
        s.on_message(w);
      } catch (const PeerError& e) {
        // A worker that breaks the protocol is dropped like a lost one; the chief is fatal.
        if (w.rank == s.cfg.chief) throw;
        s.ch.fail(w.rank, std::current_exception());
      } catch (const CollectiveMismatchError& e) {
        if (w.rank == s.cfg.chief) throw;
        s.ch.fail(w.rank, std::current_exception());
      }
    }
    s.check_failures();
    if (s.job.sync_replicas && s.initialized) s.maybe_complete_step();
    if (!moved) s.ch.wait(0.05, c);
  }
  s.drain_sends();
  // Per-ps byte counters are indexed by ps for the workers; a ps reports its own in slot 0.
  return s.stats;
}

}  // namespace mwms::strategy::ps
