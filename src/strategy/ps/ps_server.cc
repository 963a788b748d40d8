#include "strategy/ps/ps_server.h"

#include <algorithm>
#include <cstring>

#include "common/logging.h"
#include "mwms/optimizer.h"
#include "strategy/ps/ps_checkpoint.h"

namespace mwms::strategy::ps {

namespace {

using collective::FrameHeader;
using collective::MessageChannel;

constexpr std::size_t kStalenessBuckets = 33;  // 0..31, and 32 or more

enum class Phase { kRequest, kDescription, kInitValues, kPushData, kHeld, kGone };

struct Worker {
  int rank = 0;
  std::string name;
  Phase phase = Phase::kRequest;
  PsKind request = PsKind::kPull;
  std::uint64_t version = 0;  // the version its push was computed on
  std::size_t segment = 0;    // next segment to receive
  std::string blob;           // description being received
  std::vector<float> grad;    // its push lands here (the ps's layout)
  std::int64_t clock = 0;     // its pushes applied (max_staleness)
  bool joined = false;        // got kReady
  bool join_waits = false;    // joined before the chief's init: answered after it
  bool bye = false;
  bool lost = false;
  std::string refusal;        // kRefused / kFailed text (kept while being sent)
  std::uint64_t step = 0;     // save / restore: the checkpoint step
  std::string saved;          // kSaved payload (kept while being sent)
  // Note [ps streamed apply]
  bool streamed = false;        // its push is applied as it arrives (nothing lands in grad)
  bool reply_streamed = false;  // ... and its reply goes out as the update is applied
  std::vector<std::uint64_t> tickets;  // the streamed reply's segments (MessageChannel)
  bool reply_deferred = false;  // a reply waits for the streamed apply to end
  PsStatus deferred_status = PsStatus::kApplied;
  bool save_deferred = false;   // a save waits for the streamed apply to end
  std::uint64_t push_waiting = 0;  // a push waits to stream (its place in line; 0: none)
};

}  // namespace

struct PsServer::State {
  MessageChannel& ch;
  ServerConfig cfg;
  std::vector<Worker> workers;
  bool initialized = false;
  bool ended = false;  // the chief said the job ends
  JobDescription job;
  Layout layout;
  OptimizerOptions optimizer;
  std::vector<float> values;
  std::vector<std::vector<float>> slots;
  std::vector<float*> slot_ptrs;
  std::vector<float> accum;     // synchronous: the sum of this version's gradients
  int accumulated = 0;
  std::uint64_t version = 0;    // updates applied (the global step on ps 0)
  ParameterServerStats stats;
  Worker* streaming = nullptr;  // Note [ps streamed apply]: the push consumed as it arrives
  bool streaming_first = false; // synchronous: it is this version's first gradient (copied in)
  std::uint64_t line = 0;       // pushes that waited to stream, so far

  // Applies (async) or sums into accum (sync) the gradient segments of `streaming` straight
  // from the link (Note [receive sink]).
  struct ApplySink final : collective::RecvSink {
    State& st;
    explicit ApplySink(State& s) : st(s) {}
    void on_envelope(const FrameHeader& h) override {
      Worker& w = *st.streaming;
      check_segment(h, st.layout, w.segment, w.version, st.peer_ctx(w, "ps push"));
    }
    void consume(std::size_t offset, const char* data, std::size_t bytes) override {
      Worker& w = *st.streaming;
      const Segment& seg = st.layout.segments[w.segment];
      const std::size_t first = seg.element_offset + offset / sizeof(float);
      const std::size_t count = bytes / sizeof(float);
      if (st.job.sync_replicas) {
        float* a = st.accum.data() + first;
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
      if (w.reply_streamed) st.ch.set_ready(w.rank, w.tickets[w.segment], offset + bytes);
    }
    std::size_t unit() const noexcept override { return sizeof(float); }
  } sink{*this};

  State(MessageChannel& c, ServerConfig config) : ch(c), cfg(std::move(config)) {}

  ErrorContext ctx(const char* op) const {
    ErrorContext c = cfg.ctx;
    c.op = op;
    return c;
  }
  ErrorContext peer_ctx(const Worker& w, const char* op) const {
    return ch.with_peer(ctx(op), w.rank);
  }
  int live() const {
    int n = 0;
    for (const Worker& w : workers) n += !w.bye && !w.lost;
    return n;
  }
  std::uint64_t bytes() const { return layout.total * sizeof(float); }

  void expect_request(Worker& w) {
    w.phase = Phase::kRequest;
    ch.start_recv(w.rank, nullptr, 0);
  }
  void expect_segment(Worker& w, float* base) {
    const Segment& s = layout.segments[w.segment];
    ch.start_recv(w.rank, base + s.element_offset, s.count * sizeof(float),
                  w.streamed ? &sink : nullptr);
  }

  void send_values(Worker& w, PsStatus status) {
    if (streaming != nullptr && !job.sync_replicas) {  // Note [ps streamed apply]: `values`
                                                       // is changing
      w.reply_deferred = true;
      w.deferred_status = status;
      return;
    }
    queue_values(w, status, false);
  }
  // kValues at this version + every segment, sent from `values`. Gated: none of the values go
  // out until set_ready(w.tickets[segment], ...) lets them (Note [ps step pipeline]).
  void queue_values(Worker& w, PsStatus status, bool gated) {
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
  void send_ready(Worker& w) {
    w.joined = true;
    ch.queue_send(w.rank, envelope(PsKind::kReady, version, 0, cfg.ps_index), nullptr, 0);
  }
  // kRefused / kFailed + the reason (kept in w.refusal while it is sent).
  void send_reason(Worker& w, PsKind kind, std::string reason) {
    w.refusal = std::move(reason);
    if (w.refusal.size() > kMaxReasonBytes) w.refusal.resize(kMaxReasonBytes);
    ch.queue_send(w.rank, envelope(kind, version, w.refusal.size(), cfg.ps_index), nullptr, 0);
    ch.queue_send(w.rank, envelope(PsKind::kData, version, w.refusal.size(), cfg.ps_index),
                  w.refusal.data(), w.refusal.size());
  }
  void refuse(Worker& w, std::string reason) {
    MWMS_LOG_WARN(kStrat, "ps " << cfg.ps_index << ": refused " << w.name << ": " << reason);
    send_reason(w, PsKind::kRefused, std::move(reason));
    w.phase = Phase::kGone;
  }
  // A save or restore that failed (a file): the chief hears why; nothing else changes.
  void fail_request(Worker& w, std::string reason) {
    MWMS_LOG_WARN(kStrat, "ps " << cfg.ps_index << ": " << kind_name(w.request) << " for "
                                << w.name << " failed: " << reason);
    send_reason(w, PsKind::kFailed, std::move(reason));
    expect_request(w);
  }

  // Note [ps serving]: a reply in flight reads `values`; no update may overlap it.
  void drain_sends() {
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

  // The optimizer at version `version` on elements [first, first + count) of the ps's flat
  // buffer. Every optimizer is elementwise with one set of hyperparameters for the whole job, so
  // a range may span shards (the layout has no gaps).
  void apply_range(std::size_t first, const float* grad, std::size_t count) {
    for (std::size_t k = 0; k < slots.size(); ++k) slot_ptrs[k] = slots[k].data() + first;
    apply_gradient(optimizer, values.data() + first, grad, slot_ptrs.data(), count,
                   static_cast<std::int64_t>(version));
  }
  void apply(const float* grad) {
    drain_sends();
    ++version;
    apply_range(0, grad, layout.total);
    stats.global_step = static_cast<std::int64_t>(version);
  }
  void start_streaming(Worker& w);
  void end_streaming();
  void start_next_push();
  void drop_step(const char* why);
  // Waits for its step's reply (synchronous) or max_staleness (asynchronous); not a push in line,
  // a deferred save or a join before the chief's init.
  static bool awaits_values(const Worker& x) {
    return x.phase == Phase::kHeld && !x.lost && x.push_waiting == 0 && !x.save_deferred &&
           !x.join_waits;
  }

  void setup(JobDescription d, Worker& w, const char* op);
  void on_init_description(Worker& w);
  void on_restore(Worker& w);
  void on_save(Worker& w);
  void answer_waiting_joins();
  void on_join_description(Worker& w);
  void on_push(Worker& w);
  void on_request(Worker& w);
  void on_message(Worker& w);
  void release_held();
  void maybe_complete_step();
  void check_failures();
  bool done() const;
};

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
    return;
  }
  drain_sends();
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

PsServer::PsServer(MessageChannel& channel, ServerConfig config)
    : st_(std::make_unique<State>(channel, std::move(config))) {}
PsServer::~PsServer() = default;

// The chief's description becomes this ps's job: optimizer, layout, buffers.
void PsServer::State::setup(JobDescription d, Worker& w, const char* op) {
  job = std::move(d);
  optimizer.kind = static_cast<OptimizerKind>(job.optimizer);
  optimizer.learning_rate = job.learning_rate;
  optimizer.momentum = job.momentum;
  optimizer.use_nesterov = job.use_nesterov != 0;
  optimizer.beta1 = job.beta1;
  optimizer.beta2 = job.beta2;
  optimizer.epsilon = job.epsilon;
  try {
    validate(optimizer);
  } catch (const InvalidArgument& e) {
    throw PeerError("the chief's optimizer is invalid: " + e.message(), peer_ctx(w, op));
  }
  layout = ps_layout(job.shards);
  values.assign(layout.total, 0.0f);
  slots.assign(static_cast<std::size_t>(num_slots(optimizer.kind)),
               std::vector<float>(layout.total, 0.0f));
  slot_ptrs.assign(slots.size(), nullptr);
  if (job.sync_replicas) accum.assign(layout.total, 0.0f);
  for (Worker& x : workers) {
    x.grad.assign(layout.total, 0.0f);
    x.tickets.assign(layout.segments.size(), 0);
  }
  MWMS_LOG_INFO(kStrat, "ps " << cfg.ps_index << ": " << job.shards.size() << " shards, "
                              << layout.total << " elements, " << layout.segments.size()
                              << " segments, " << (job.sync_replicas ? "sync" : "async"));
}

void PsServer::State::on_init_description(Worker& w) {
  setup(decode(w.blob.data(), w.blob.size(), peer_ctx(w, "ps init")), w, "ps init");
  w.segment = 0;
  if (layout.segments.empty()) {
    initialized = true;
    send_ready(w);
    expect_request(w);
    return;
  }
  w.phase = Phase::kInitValues;
  expect_segment(w, values.data());
}

void PsServer::State::answer_waiting_joins() {
  for (Worker& x : workers) {
    if (!x.join_waits || x.lost) continue;
    x.join_waits = false;
    on_join_description(x);
  }
}

// Note [ps checkpoint files]: the chief verified the manifest and every shard file before asking;
// this ps reads its own file again (it may be on another host's view of a shared directory) and
// takes nothing that does not match the chief's description exactly.
void PsServer::State::on_restore(Worker& w) {
  const ErrorContext c = peer_ctx(w, "ps restore");
  RestoreRequest q = decode_restore(w.blob.data(), w.blob.size(), c);
  setup(decode(q.description.data(), q.description.size(), c), w, "ps restore");
  const std::string path =
      shard_file_path(q.directory, w.step, static_cast<std::uint32_t>(cfg.ps_index),
                      static_cast<std::uint32_t>(job.num_ps));
  try {
    ManifestEntry want;
    want.version = q.expected.version;
    want.file_bytes = q.expected.file_bytes;
    want.file_crc32 = q.expected.file_crc32;
    ShardFile f = read_shard_file(path, &want);
    std::string why;
    if (f.ps_index != static_cast<std::uint32_t>(cfg.ps_index) ||
        f.num_ps != static_cast<std::uint32_t>(job.num_ps)) {
      why = "it is ps " + std::to_string(f.ps_index) + " of " + std::to_string(f.num_ps) +
            "'s file, this is ps " + std::to_string(cfg.ps_index) + " of " +
            std::to_string(job.num_ps);
    } else if (f.optimizer != job.optimizer) {
      why = "it holds " + std::string(to_string(static_cast<OptimizerKind>(f.optimizer))) +
            " slots, the job runs " + std::string(to_string(optimizer.kind));
    } else if (f.shards != job.shards) {
      why = "its shards differ from the variables the chief declared";
    } else if (f.values.size() != values.size() || f.slots.size() != slots.size()) {
      why = "its sizes differ from the layout";
    }
    if (!why.empty()) throw CheckpointError("checkpoint " + path + ": " + why, path);
    values = std::move(f.values);
    for (std::size_t k = 0; k < slots.size(); ++k) slots[k] = std::move(f.slots[k]);
    version = f.version;
    stats.global_step = static_cast<std::int64_t>(version);
  } catch (const CheckpointError& e) {
    job = JobDescription{};
    fail_request(w, e.message());
    return;
  }
  MWMS_LOG_INFO(kStrat, "ps " << cfg.ps_index << ": restored " << path << " (global step "
                              << version << ")");
  initialized = true;
  send_ready(w);
  expect_request(w);
  answer_waiting_joins();
}

void PsServer::State::on_save(Worker& w) {
  ShardFileView v;
  v.ps_index = static_cast<std::uint32_t>(cfg.ps_index);
  v.num_ps = static_cast<std::uint32_t>(job.num_ps);
  v.checkpoint_step = w.step;
  v.version = version;
  v.optimizer = job.optimizer;
  v.shards = &job.shards;
  v.values = values.data();
  for (const std::vector<float>& slot : slots) v.slots.push_back(slot.data());
  v.total = layout.total;
  ManifestEntry e;
  try {
    e = write_shard_file(w.blob, v);
  } catch (const CheckpointError& x) {
    fail_request(w, x.message());
    return;
  }
  w.saved = encode_saved(ShardFileStamp{e.version, e.file_bytes, e.file_crc32});
  ch.queue_send(w.rank, envelope(PsKind::kSaved, version, w.saved.size(), cfg.ps_index), nullptr,
                0);
  ch.queue_send(w.rank, envelope(PsKind::kData, version, w.saved.size(), cfg.ps_index),
                w.saved.data(), w.saved.size());
  expect_request(w);
}

void PsServer::State::on_join_description(Worker& w) {
  JobDescription d = decode(w.blob.data(), w.blob.size(), peer_ctx(w, "ps join"));
  std::string diff = first_difference(job, d);
  if (!diff.empty()) {
    refuse(w, w.name + " does not match the chief: " + diff);
    return;
  }
  send_ready(w);
  expect_request(w);
}

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
      if (h.count > kMaxDescriptionBytes) {
        throw PeerError("a description of " + std::to_string(h.count) + " bytes (at most " +
                        std::to_string(kMaxDescriptionBytes) + ")", c);
      }
      if (w.request == PsKind::kInit && w.rank != cfg.chief) {
        refuse(w, "only the chief initializes the variables");
        return;
      }
      if (w.request == PsKind::kInit && initialized) {
        refuse(w, "the variables are already initialized (a restarted chief must restart the "
                  "whole job)");
        return;
      }
      w.blob.assign(static_cast<std::size_t>(h.count), '\0');
      w.phase = Phase::kDescription;
      ch.start_recv(w.rank, w.blob.data(), w.blob.size());
      return;
    case PsKind::kSave:
    case PsKind::kRestore: {
      const bool save = w.request == PsKind::kSave;
      const std::size_t bound = save ? kMaxDirectoryBytes : kMaxRestoreBytes;
      if (h.count > bound) {
        throw PeerError(std::string("a ") + kind_name(w.request) + " request of " +
                        std::to_string(h.count) + " bytes (at most " + std::to_string(bound) +
                        ")", c);
      }
      if (w.rank != cfg.chief) {
        refuse(w, std::string("only the chief may ") + kind_name(w.request) + " a checkpoint");
        return;
      }
      if (save != initialized) {
        refuse(w, save ? "save before the variables were initialized"
                       : "restore after the variables were initialized (restore only starts a "
                         "job)");
        return;
      }
      w.step = h.seq;
      w.blob.assign(static_cast<std::size_t>(h.count), '\0');
      w.phase = Phase::kDescription;
      ch.start_recv(w.rank, w.blob.data(), w.blob.size());
      return;
    }
    case PsKind::kPush:
    case PsKind::kPull:
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
      return;
    case PsKind::kBye:
      w.bye = true;
      w.phase = Phase::kGone;
      if (w.rank == cfg.chief && h.count == 1) ended = true;
      ch.retire(w.rank);
      MWMS_LOG_INFO(kStrat, "ps " << cfg.ps_index << ": " << w.name << " said goodbye"
                                  << (h.count == 1 ? " and ended the job" : ""));
      return;
    default:
      throw PeerError(std::string("unexpected ") + kind_name(w.request) + " request", c);
  }
}

void PsServer::State::on_push(Worker& w) {
  const bool streamed = w.streamed;
  const bool replied = w.reply_streamed;
  end_streaming();
  if (ended) {
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
  const float inv = static_cast<float>(accumulated);
  stats.applied += accumulated;
  accumulated = 0;
  drain_sends();
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
    for (std::size_t i = 0; i < n; ++i) a[i] /= inv;  // ConditionalAccumulator.take_grad: mean
    apply_range(first, a, n);
    const std::size_t done = first + n;
    while (segment < layout.segments.size()) {
      const Segment& sg = layout.segments[segment];
      const std::size_t upto = std::min(done, sg.element_offset + sg.count);
      for (Worker& x : workers) {
        if (awaits_values(x)) {
          ch.set_ready(x.rank, x.tickets[segment], (upto - sg.element_offset) * sizeof(float));
        }
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

void PsServer::State::on_message(Worker& w) {
  switch (w.phase) {
    case Phase::kRequest:
      on_request(w);
      return;
    case Phase::kDescription:
      if (w.request == PsKind::kInit) {
        on_init_description(w);
        return;
      }
      if (w.request == PsKind::kRestore) {
        on_restore(w);
        return;
      }
      if (w.request == PsKind::kSave) {
        if (streaming != nullptr && !job.sync_replicas) {  // Note [ps streamed apply]: a
                                                           // checkpoint of whole updates
          w.save_deferred = true;
          w.phase = Phase::kHeld;
          return;
        }
        on_save(w);
        return;
      }
      if (!initialized) {
        w.join_waits = true;  // answered once the chief initialized
        w.phase = Phase::kHeld;
        return;
      }
      on_join_description(w);
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
      end_streaming();
      // Asynchronous: what arrived of its gradient stays applied. Synchronous: the sum is partial.
      if (job.sync_replicas) drop_step(("lost " + w.name + " in the middle of its push").c_str());
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
