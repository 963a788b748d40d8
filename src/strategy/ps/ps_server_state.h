// PsServer's private state (ps_server.h), shared by the files that implement it:
//   ps_server.cc        the message loop (serve), the request dispatch, replies, failure checks
//                       (Note [ps serving] in ps_server.h)
//   ps_server_steps.cc  pushes and pulls: the streamed apply, synchronous step aggregation and
//                       asynchronous staleness holds (Note [ps streamed apply], Note [ps step
//                       pipeline])
//   ps_server_admin.cc  the chief's init, restore and save, and the workers' joins (Note [ps
//                       checkpoint files] in ps_checkpoint.h)
// Private to src/strategy/ps: nothing outside it includes this header.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "collective/engine/message_channel.h"
#include "common/logging.h"
#include "mwms/errors.h"
#include "mwms/optimizer.h"
#include "strategy/ps/ps_protocol.h"
#include "strategy/ps/ps_server.h"
#include "strategy/ps/ps_shared_values.h"

namespace mwms::strategy::ps {

namespace detail {

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
  // Note [ps shared values] (ps_shared_values.h)
  bool shm = false;      // its link is shared memory: it may map the values
  bool mapped = false;   // it got their address in kReady: its replies are kSharedValues
  bool reading = false;  // it is copying a kSharedValues reply (until its kCopied)
  std::string address;   // kReady's payload (kept while being sent)
};

// The ps's flat buffer of values: its own memory, or shared memory that the workers on its host
// map (Note [ps shared values]); publish() and reset() track an update's progress there.
struct Values {
  std::vector<float> own;
  std::unique_ptr<SharedValues> shared;
  float* ptr = nullptr;
  std::size_t n = 0;

  float* data() const noexcept { return ptr; }
  std::size_t size() const noexcept { return n; }
  // `count` zeros; in shared memory with `share` (the same memory again for the same count).
  void assign(std::size_t count, bool share) {
    if (share && (shared == nullptr || shared->count() != count)) {
      try {
        shared = SharedValues::create(count);
      } catch (const BackendError& e) {  // a /dev/shm too small: the links carry them instead
        MWMS_LOG_WARN(kStrat, "ps values stay in this process's memory (MWMS_PS_SHARED_VALUES): "
                                  << e.message());
        share = false;
      }
    }
    if (share) {
      own.clear();
      ptr = shared->data();
      std::fill(ptr, ptr + count, 0.0f);
      shared->publish(count);
    } else {
      shared.reset();
      own.assign(count, 0.0f);
      ptr = own.data();
    }
    n = count;
  }
  void publish(std::size_t elements) noexcept {
    if (shared != nullptr) shared->publish(elements);
  }
  void reset() noexcept {
    if (shared != nullptr) shared->reset();
  }
};

}  // namespace detail

struct PsServer::State {
  using Phase = detail::Phase;
  using Worker = detail::Worker;

  collective::MessageChannel& ch;
  ServerConfig cfg;
  std::vector<Worker> workers;
  bool initialized = false;
  bool ended = false;  // the chief said the job ends
  JobDescription job;
  Layout layout;
  OptimizerOptions optimizer;
  detail::Values values;
  std::vector<std::vector<float>> slots;
  std::vector<float*> slot_ptrs;
  std::vector<float> accum;     // synchronous: the sum of this version's gradients
  int accumulated = 0;
  std::uint64_t version = 0;    // updates applied (the global step on ps 0)
  ParameterServerStats stats;
  Worker* streaming = nullptr;  // Note [ps streamed apply]: the push consumed as it arrives
  bool streaming_first = false; // synchronous: it is this version's first gradient (copied in)
  // Synchronous, Note [ps fused step]: `streaming` is the push that completes this step, so its
  // segments are summed, averaged and applied as they arrive, and every reply let out behind.
  bool fused = false;
  int fused_count = 0;          // the gradients of the fused step, the streaming one included
  std::size_t fused_done = 0;   // elements of the flat buffer the fused step has applied
  std::uint64_t line = 0;       // pushes that waited to stream, so far

  // Applies (async) or sums into accum (sync) the gradient segments of `streaming` straight
  // from the link (Note [receive sink]). In ps_server_steps.cc.
  struct ApplySink final : collective::RecvSink {
    State& st;
    explicit ApplySink(State& s) : st(s) {}
    void on_envelope(const collective::FrameHeader& h) override;
    void consume(std::size_t offset, const char* data, std::size_t bytes) override;
    std::size_t unit() const noexcept override { return sizeof(float); }
  } sink{*this};

  State(collective::MessageChannel& c, ServerConfig config) : ch(c), cfg(std::move(config)) {}

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

  // Replies (ps_server.cc).
  void send_values(Worker& w, PsStatus status);
  // kValues at this version + every segment, sent from `values`. Gated: none of the values go
  // out until set_ready(w.tickets[segment], ...) lets them (Note [ps step pipeline]).
  void queue_values(Worker& w, PsStatus status, bool gated);
  // kReady, with the shared values' address for a worker that may map them.
  void send_ready(Worker& w);
  // Lets the first `bytes` of segment `segment` of x's gated reply out (ring replies only: a
  // kSharedValues reader follows values.publish()).
  void let_out(Worker& x, std::size_t segment, std::size_t bytes) noexcept {
    if (!x.mapped) ch.set_ready(x.rank, x.tickets[segment], bytes);
  }
  // Before anything changes `values` (Note [ps serving], Note [ps shared values]): no reply in
  // flight reads them, no worker still copies them, and the progress starts from 0.
  void begin_update();
  // A reader's kCopied (Note [ps shared values]).
  void on_copied(Worker& w, const collective::FrameHeader& h, const ErrorContext& c);
  // kRefused / kFailed + the reason (kept in w.refusal while it is sent).
  void send_reason(Worker& w, PsKind kind, std::string reason);
  void refuse(Worker& w, std::string reason);
  // A save or restore that failed (a file): the chief hears why; nothing else changes.
  void fail_request(Worker& w, std::string reason);
  // Note [ps serving]: a reply in flight reads `values`; no update may overlap it.
  void drain_sends();

  // Updates and steps (ps_server_steps.cc).
  // The optimizer at version `version` on elements [first, first + count) of the ps's flat
  // buffer. Every optimizer is elementwise with one set of hyperparameters for the whole job, so
  // a range may span shards (the layout has no gaps).
  void apply_range(std::size_t first, const float* grad, std::size_t count);
  void apply(const float* grad);
  void start_streaming(Worker& w);
  void end_streaming();
  // `values` is changing under a streamed push: replies and saves wait (Note [ps streamed apply]).
  bool values_changing() const { return streaming != nullptr && (!job.sync_replicas || fused); }
  int step_needs() const { return std::max(1, std::min(job.replicas_to_aggregate, live())); }
  // Note [ps fused step] (ps_server_steps.cc).
  void begin_fused_step(Worker& w);
  void fused_range(std::size_t first, const float* a, const float* g, std::size_t count);
  void end_fused_step(Worker& w);
  void finish_fused_step_without(Worker& lost);
  void start_next_push();
  void drop_step(const char* why);
  // Waits for its step's reply (synchronous) or max_staleness (asynchronous); not a push in line,
  // a deferred save or a join before the chief's init.
  static bool awaits_values(const Worker& x) {
    return x.phase == Phase::kHeld && !x.lost && x.push_waiting == 0 && !x.save_deferred &&
           !x.join_waits;
  }
  void on_pull_or_push(Worker& w, const collective::FrameHeader& h, const ErrorContext& c);
  void on_push(Worker& w);
  void release_held();
  void maybe_complete_step();

  // The job's description and checkpoints (ps_server_admin.cc).
  void setup(JobDescription d, Worker& w, const char* op);
  void on_description_request(Worker& w, const collective::FrameHeader& h, const ErrorContext& c);
  void on_checkpoint_request(Worker& w, const collective::FrameHeader& h, const ErrorContext& c);
  void on_description(Worker& w);
  void on_init_description(Worker& w);
  void on_restore(Worker& w);
  void on_save(Worker& w);
  void answer_waiting_joins();
  void on_join_description(Worker& w);

  // The loop (ps_server.cc).
  void on_request(Worker& w);
  void on_message(Worker& w);
  void check_failures();
  bool done() const;
};

}  // namespace mwms::strategy::ps
