// ParameterServerStrategy (mwms/parameter_server.h): the worker side of the protocol of
// ps_protocol.h, and the ps side through PsServer.
//
// Note [ps job mesh]: a parameter-server job is one mesh of every training task and every ps
// task: ranks 0..W-1 are the chief and the workers as in an all-reduce ring, ranks W..W+P-1 the
// ps tasks in list order (Note [ps rank] in bootstrap/tf_config.cc). It is connected exactly as a
// Communicator is (collective::connect_job: rendezvous, peer-info exchange, one link per pair over
// shared memory, TCP or MPI, control plane and heartbeat, MWMS_AUTH_KEY), so a ps and its workers
// get the deadlines, death notices and authentication that collectives have.
#include <algorithm>
#include <cstring>
#include <optional>
#include <set>
#include <utility>

#include "bootstrap/error_context.h"
#include "collective/communicator_factory.h"
#include "collective/engine/message_channel.h"
#include "common/env.h"
#include "common/logging.h"
#include "mwms/parameter_server.h"
#include "strategy/ps/ps_checkpoint.h"
#include "strategy/ps/ps_protocol.h"
#include "strategy/ps/ps_server.h"

namespace mwms {

namespace {

using collective::FrameHeader;
using strategy::ps::JobDescription;
using strategy::ps::Layout;
using strategy::ps::PsKind;
using strategy::ps::PsStatus;
using strategy::ps::Segment;
using strategy::ps::ShardDescription;

double since(common::Clock::time_point t) {
  return std::chrono::duration<double>(common::Clock::now() - t).count();
}

// Note [ps job mesh].
ResolvedCluster ps_job_cluster(const ResolvedCluster& c) {
  ResolvedCluster job = c;
  auto it = c.cluster.jobs().find("ps");
  if (it != c.cluster.jobs().end()) job.ring.insert(job.ring.end(), it->second.begin(),
                                                    it->second.end());
  job.num_workers = c.num_workers + c.num_ps;
  job.in_ring = true;
  return job;
}

struct Variable {
  VariableSpec spec;
  std::size_t count = 0;
  float* value = nullptr;
  float* gradient = nullptr;
  std::function<void(float*, std::size_t)> initializer;
};

// What a worker keeps per ps.
struct PsLink {
  int rank = 0;
  std::string name;
  JobDescription description;
  std::string blob;
  Layout layout;
  std::vector<const VariableShard*> shards;  // placement order
  std::vector<float> push_pack;
  std::vector<float> pull_pack;
  std::uint64_t version = 0;
  // One request in flight.
  enum class Phase { kIdle, kHeader, kReason, kSegments, kSaved, kDone } phase = Phase::kIdle;
  PsKind expect = PsKind::kValues;
  std::size_t segment = 0;
  std::string reason;
  bool refused = false;  // kRefused (fatal) rather than kFailed (that request only)
  bool failed = false;   // the request got kFailed: `reason` says why
  std::string saved;     // kSaved's payload
  std::string request;   // a save or restore request's payload (kept while being sent)
  PsStatus status = PsStatus::kApplied;
};

}  // namespace

struct ParameterServerStrategy::Impl {
  ResolvedCluster cluster;
  ParameterServerOptions options;
  collective::ConnectedJob job;
  std::unique_ptr<collective::MessageChannel> channel;
  double timeout = 300;
  bool ps = false;
  std::vector<Variable> variables;
  std::vector<VariableShard> placement;
  std::vector<PsLink> links;
  bool initialized = false;
  bool finalized = false;
  bool stop = false;
  std::int64_t global_step = 0;
  std::string restored_from;  // the manifest initialize() restored, empty for a fresh start
  ParameterServerStats stats;

  ErrorContext ctx(const char* op) const {
    ErrorContext c = bootstrap::task_context(job.cluster, op);
    c.task = cluster.task_name();  // as the user named it: job.cluster is Note [ps job mesh]
    c.timeout_seconds = timeout;
    return c;
  }
  float* value_of(const VariableShard& s) const {
    return variables[static_cast<std::size_t>(s.variable)].value + s.element_offset;
  }
  float* gradient_of(const VariableShard& s) const {
    return variables[static_cast<std::size_t>(s.variable)].gradient + s.element_offset;
  }

  void queue_segments(PsLink& l, std::uint64_t seq, bool gradients) {
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
  void expect(PsLink& l, PsKind kind) {
    l.phase = PsLink::Phase::kHeader;
    l.failed = false;
    l.expect = kind;
    channel->start_recv(l.rank, nullptr, 0);
  }
  void expect_segment(PsLink& l) {
    const Segment& seg = l.layout.segments[l.segment];
    float* dst = seg.pack ? l.pull_pack.data() : value_of(*l.shards[seg.first_shard]);
    channel->start_recv(l.rank, dst, seg.count * sizeof(float));
  }
  void unpack(PsLink& l) {
    if (l.layout.segments.empty() || !l.layout.segments[0].pack) return;
    const std::size_t packed = l.layout.segments[0].count;
    for (std::size_t k = 0; k < l.shards.size(); ++k) {
      if (l.layout.shard_offset[k] >= packed) continue;
      std::memcpy(value_of(*l.shards[k]), l.pull_pack.data() + l.layout.shard_offset[k],
                  l.shards[k]->count * sizeof(float));
    }
  }

  [[noreturn]] void throw_failure(const PsLink& l, const ErrorContext& c) {
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

  void on_message(PsLink& l, const ErrorContext& c) {
    const FrameHeader& h = channel->recv_header(l.rank);
    const ErrorContext pc = channel->with_peer(c, l.rank);
    switch (l.phase) {
      case PsLink::Phase::kHeader:
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
        if (h.kind != static_cast<std::uint8_t>(l.expect)) {
          throw PeerError(l.name + " answered " + collective::describe(h) + " where a " +
                              strategy::ps::kind_name(l.expect) + " reply was expected", pc);
        }
        l.version = h.seq;
        if (l.expect == PsKind::kReady) {
          l.phase = PsLink::Phase::kDone;
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
        if (l.layout.segments.empty()) {
          l.phase = PsLink::Phase::kDone;
          return;
        }
        l.phase = PsLink::Phase::kSegments;
        expect_segment(l);
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
      case PsLink::Phase::kDone:
        return;
    }
  }

  // Drives every ps's request to its reply (Note [message channel]); the deadline counts time
  // without any progress.
  void run(const char* op, const char* waiting_for) {
    const ErrorContext c = ctx(op);
    auto last = common::Clock::now();
    for (;;) {
      const bool moved = channel->pump(c);
      bool all = true;
      for (PsLink& l : links) {
        if (channel->failed(l.rank)) throw_failure(l, c);
        if (l.phase != PsLink::Phase::kDone && channel->recv_done(l.rank)) on_message(l, c);
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
      channel->wait(0.05, c);
    }
  }

  void exchange(PsKind request, PsKind reply, const char* op, const char* why) {
    for (PsLink& l : links) {
      const std::uint64_t seq = request == PsKind::kPush ? l.version : 0;
      channel->queue_send(l.rank, strategy::ps::envelope(request, seq), nullptr, 0);
      if (request == PsKind::kPush) queue_segments(l, l.version, true);
      expect(l, reply);
    }
    run(op, why);
  }

  // "ps 0 at host:port: why; ps 1 ...": the requests that got kFailed.
  std::string failures() const {
    std::string text;
    for (const PsLink& l : links) {
      if (!l.failed) continue;
      text += (text.empty() ? "" : "; ") + l.name + ": " + l.reason;
    }
    return text;
  }

  // Note [ps checkpoint files]: the newest checkpoint of `dir` whose manifest and every shard
  // file verify and hold exactly the shards this job places on each ps; older ones are tried in
  // turn (each skipped one logged). Returns its manifest and step; nullopt when `dir` holds no
  // checkpoint. @throws CheckpointError when it holds some and none is usable.
  std::optional<std::pair<std::uint64_t, strategy::ps::Manifest>> find_checkpoint(
      const std::string& dir) const {
    namespace sp = strategy::ps;
    const std::vector<std::uint64_t> steps = sp::list_checkpoints(dir);
    std::string skipped;
    const auto n = static_cast<std::uint32_t>(links.size());
    for (std::uint64_t step : steps) {
      try {
        sp::Manifest mf = sp::read_manifest(sp::manifest_path(dir, step));
        if (mf.entries.size() != n) {
          throw CheckpointError("written by a job of " + std::to_string(mf.entries.size()) +
                                    " ps, this one has " + std::to_string(n),
                                sp::manifest_path(dir, step));
        }
        for (std::uint32_t p = 0; p < n; ++p) {
          const std::string path = sp::shard_file_path(dir, step, p, n);
          const sp::ShardFile f = sp::read_shard_file(path, &mf.entries[p]);
          const JobDescription& d = links[p].description;
          if (f.optimizer != d.optimizer) {
            throw CheckpointError(
                path + ": holds " +
                    std::string(to_string(static_cast<OptimizerKind>(f.optimizer))) +
                    " slots, this job runs " +
                    std::string(to_string(static_cast<OptimizerKind>(d.optimizer))),
                path);
          }
          if (f.shards != d.shards) {
            throw CheckpointError(path + ": written for other variables (names, shapes, "
                                  "placement or partitioning) than this job declares", path);
          }
        }
        if (!skipped.empty()) {
          MWMS_LOG_WARN(kStrat, "restoring the checkpoint of step " << step << " in " << dir
                                << "; newer ones are unusable: " << skipped);
        }
        return std::make_pair(step, std::move(mf));
      } catch (const CheckpointError& e) {
        skipped += (skipped.empty() ? "" : "; ") + ("step " + std::to_string(step) + ": ") +
                   e.message();
      }
    }
    if (steps.empty()) return std::nullopt;
    throw CheckpointError("no usable checkpoint in " + dir + " (" + skipped + ")", dir);
  }

  // The chief: every ps restores its shard file of the newest usable checkpoint of `dir`.
  // Returns false when `dir` holds none (a fresh start).
  bool restore(const std::string& dir) {
    auto found = find_checkpoint(dir);
    if (!found) return false;
    const auto& [step, mf] = *found;
    for (std::size_t p = 0; p < links.size(); ++p) {
      PsLink& l = links[p];
      strategy::ps::RestoreRequest q;
      q.description = l.blob;
      q.expected = {mf.entries[p].version, mf.entries[p].file_bytes, mf.entries[p].file_crc32};
      q.directory = dir;
      l.request = strategy::ps::encode_restore(q);
      channel->queue_send(l.rank, strategy::ps::envelope(PsKind::kRestore, step, l.request.size()),
                          nullptr, 0);
      channel->queue_send(l.rank, strategy::ps::envelope(PsKind::kData, step, l.request.size()),
                          l.request.data(), l.request.size());
      expect(l, PsKind::kReady);
    }
    run("ps restore", "the ps reads its shard file");
    if (const std::string why = failures(); !why.empty()) {
      throw CheckpointError("restoring the checkpoint of step " + std::to_string(step) + " in " +
                                dir + " failed: " + why,
                            strategy::ps::manifest_path(dir, step));
    }
    restored_from = strategy::ps::manifest_path(dir, step);
    MWMS_LOG_INFO(kStrat, "restored " << restored_from << " (global step " << links[0].version
                                      << ")");
    initialized = true;
    return true;
  }

  void finish_values() {
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
};

ParameterServerStrategy::ParameterServerStrategy(const ResolvedCluster& cluster,
                                                 ParameterServerOptions options)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.cluster = cluster;
  m.options = options;
  if (cluster.num_ps < 1) {
    throw BootstrapError("a ParameterServerStrategy needs a \"ps\" job in the cluster (" +
                         cluster.task_name() + " resolved from " +
                         source_name(cluster.source) + " has none)");
  }
  if (cluster.task.type == "evaluator") {
    throw BootstrapError("the evaluator " + cluster.task_name() + " does not train: it has no "
                         "part in a parameter-server job (run it on its own)");
  }
  validate(options.optimizer);
  const int n = cluster.num_workers;
  int& r = m.options.replicas_to_aggregate;
  int& total = m.options.total_num_replicas;
  if (r == 0) r = n;
  if (total == 0) total = n;
  if (r < 1 || total != n || r > total) {
    throw InvalidArgument("replicas_to_aggregate " + std::to_string(r) +
                          " and total_num_replicas " + std::to_string(total) + " must satisfy "
                          "1 <= replicas_to_aggregate <= total_num_replicas == the number of "
                          "training tasks (" + std::to_string(n) + ")");
  }
  if (options.max_staleness < -1) {
    throw InvalidArgument("max_staleness must be -1 (no bound) or >= 0");
  }
  m.ps = cluster.task.type == "ps";
  CommunicatorOptions copts;
  copts.timeout_seconds = options.timeout_seconds;
  copts.connect_timeout_seconds = options.connect_timeout_seconds;
  copts.transport = options.transport;
  m.job = collective::connect_job(ps_job_cluster(cluster), copts);
  m.timeout = m.job.timeout_seconds;
  // Note [ps spin]: a worker's wait for a reply lasts the ps's whole update (receive, aggregate,
  // apply, send: ~0.3 ms for train's 814 KB MLP), and a ps's wait for the next push about as
  // long, not one chunk's transfer as in a collective. Sleeping after the collectives' 50 us
  // spin turns every reply into a futex wake-up through the scheduler, which on a host with
  // more tasks than cores costs more than the update itself: 1 ms of polling (yielding the core
  // when tasks outnumber cores) took ps-sync `train` from ~18,000 to ~25,000 images/s here.
  if (!common::env_is_set("MWMS_SPIN_MICROSECONDS")) {
    m.job.engine.runner.spin_seconds = std::max(m.job.engine.runner.spin_seconds, 1e-3);
  }
  std::vector<collective::Link*> raw;
  for (auto& l : m.job.links) raw.push_back(l.get());
  m.channel = std::make_unique<collective::MessageChannel>(std::move(raw), m.job.control.get(),
                                                           m.job.engine.runner);
  m.stats.bytes_pushed.assign(static_cast<std::size_t>(cluster.num_ps), 0);
  m.stats.bytes_pulled.assign(static_cast<std::size_t>(cluster.num_ps), 0);
  if (m.job.cluster.is_chief) {
    MWMS_LOG_INFO(kStrat, "parameter-server job: " << n << " worker(s), " << cluster.num_ps
                                                   << " ps, "
                                                   << (options.sync_replicas ? "sync" : "async"));
  }
}

ParameterServerStrategy::~ParameterServerStrategy() = default;

bool ParameterServerStrategy::is_ps() const noexcept { return impl_->ps; }
bool ParameterServerStrategy::is_chief() const noexcept { return impl_->cluster.is_chief; }
int ParameterServerStrategy::num_workers() const noexcept { return impl_->cluster.num_workers; }
int ParameterServerStrategy::num_ps() const noexcept { return impl_->cluster.num_ps; }
int ParameterServerStrategy::worker_index() const noexcept {
  return impl_->ps ? -1 : impl_->cluster.task_id;
}
const ResolvedCluster& ParameterServerStrategy::cluster() const noexcept {
  return impl_->cluster;
}
const ParameterServerOptions& ParameterServerStrategy::options() const noexcept {
  return impl_->options;
}
const std::vector<VariableShard>& ParameterServerStrategy::placement() const noexcept {
  return impl_->placement;
}
std::int64_t ParameterServerStrategy::global_step() const noexcept { return impl_->global_step; }
bool ParameterServerStrategy::should_stop() const noexcept { return impl_->stop; }
ParameterServerStats ParameterServerStrategy::stats() const { return impl_->stats; }

float* ParameterServerStrategy::value(int index) const {
  if (index < 0 || index >= static_cast<int>(impl_->variables.size())) {
    throw InvalidArgument("no variable " + std::to_string(index));
  }
  return impl_->variables[static_cast<std::size_t>(index)].value;
}

int ParameterServerStrategy::create_variable(
    const VariableSpec& spec, float* value, float* gradient,
    std::function<void(float* value, std::size_t count)> initializer) {
  Impl& m = *impl_;
  if (m.ps) throw InvalidUsage("create_variable on " + m.cluster.task_name() + ", a ps task");
  if (m.initialized) throw InvalidUsage("create_variable after initialize()");
  if (spec.dtype != DataType::kFloat32) {
    throw InvalidArgument("variable " + spec.name + ": parameter servers hold float32 variables "
                          "(got " + std::string(to_string(spec.dtype)) + ")");
  }
  std::size_t count = 1;
  for (std::int64_t d : spec.shape) {
    if (d < 0) throw InvalidArgument("variable " + spec.name + " has a negative dimension");
    count *= static_cast<std::size_t>(d);
  }
  if (count > 0 && (value == nullptr || gradient == nullptr)) {
    throw InvalidArgument("variable " + spec.name + ": value and gradient must not be null");
  }
  for (const Variable& v : m.variables) {
    if (v.spec.name == spec.name) {
      throw InvalidArgument("variable " + spec.name + " is declared twice");
    }
  }
  Variable v;
  v.spec = spec;
  v.count = count;
  v.value = value;
  v.gradient = gradient;
  v.initializer = std::move(initializer);
  m.variables.push_back(std::move(v));
  return static_cast<int>(m.variables.size()) - 1;
}

std::int64_t ParameterServerStrategy::initialize(const std::string& checkpoint_dir) {
  Impl& m = *impl_;
  if (m.ps) throw InvalidUsage("initialize on " + m.cluster.task_name() + ", a ps task");
  if (m.initialized) throw InvalidUsage("initialize() called twice");
  std::vector<VariableSpec> specs;
  for (const Variable& v : m.variables) specs.push_back(v.spec);
  m.placement = place_variables(specs, m.cluster.num_ps, m.options.placement,
                                m.options.partitioner);
  JobDescription common;
  common.sync_replicas = m.options.sync_replicas ? 1 : 0;
  common.replicas_to_aggregate = m.options.replicas_to_aggregate;
  common.total_num_replicas = m.options.total_num_replicas;
  common.max_staleness = m.options.max_staleness;
  const OptimizerOptions& o = m.options.optimizer;
  common.optimizer = static_cast<std::uint8_t>(o.kind);
  common.learning_rate = o.learning_rate;
  common.momentum = o.momentum;
  common.use_nesterov = o.use_nesterov ? 1 : 0;
  common.beta1 = o.beta1;
  common.beta2 = o.beta2;
  common.epsilon = o.epsilon;
  common.num_workers = m.cluster.num_workers;
  common.num_ps = m.cluster.num_ps;
  m.links.assign(static_cast<std::size_t>(m.cluster.num_ps), PsLink{});
  for (int p = 0; p < m.cluster.num_ps; ++p) {
    PsLink& l = m.links[static_cast<std::size_t>(p)];
    l.rank = m.cluster.num_workers + p;
    l.name = m.job.cluster.task_name_of_rank(l.rank) + " at " +
             m.job.cluster.ring[static_cast<std::size_t>(l.rank)];
    l.description = common;
    for (const VariableShard& s : m.placement) {
      if (s.ps_task != p) continue;
      l.shards.push_back(&s);
      ShardDescription d;
      d.name = s.name;
      d.variable = static_cast<std::uint32_t>(s.variable);
      d.shard = static_cast<std::uint32_t>(s.shard);
      d.element_offset = s.element_offset;
      d.count = s.count;
      l.description.shards.push_back(std::move(d));
    }
    l.layout = strategy::ps::ps_layout(l.description.shards);
    const std::size_t packed =
        !l.layout.segments.empty() && l.layout.segments[0].pack ? l.layout.segments[0].count : 0;
    l.push_pack.assign(packed, 0.0f);
    l.pull_pack.assign(packed, 0.0f);
    l.blob = strategy::ps::encode(l.description);
  }
  const bool chief = m.cluster.is_chief;
  if (chief && !checkpoint_dir.empty() && m.restore(checkpoint_dir)) return pull();
  if (chief) {
    for (Variable& v : m.variables) {
      if (v.initializer) v.initializer(v.value, v.count);
    }
  }
  for (PsLink& l : m.links) {
    m.channel->queue_send(l.rank,
                          strategy::ps::envelope(chief ? PsKind::kInit : PsKind::kJoin, 0,
                                                 l.blob.size()),
                          nullptr, 0);
    m.channel->queue_send(l.rank, strategy::ps::envelope(PsKind::kData, 0, l.blob.size()),
                          l.blob.data(), l.blob.size());
    if (chief) m.queue_segments(l, 0, false);
    m.expect(l, PsKind::kReady);
  }
  m.run(chief ? "ps init" : "ps join",
        chief ? "the ps stores the initial values" : "the ps waits for the chief to initialize "
                                                     "the variables");
  m.initialized = true;
  return pull();
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

const std::string& ParameterServerStrategy::restored_from() const noexcept {
  return impl_->restored_from;
}

std::string ParameterServerStrategy::save_checkpoint(const std::string& dir, int max_to_keep) {
  namespace sp = strategy::ps;
  Impl& m = *impl_;
  if (m.ps || !m.cluster.is_chief) {
    throw InvalidUsage("save_checkpoint on " + m.cluster.task_name() + ": only the chief saves");
  }
  if (!m.initialized || m.finalized) {
    throw InvalidUsage("save_checkpoint() before initialize() or after finalize()");
  }
  if (dir.empty() || dir.size() > sp::kMaxDirectoryBytes) {
    throw InvalidArgument("save_checkpoint: the directory must be 1 to " +
                          std::to_string(sp::kMaxDirectoryBytes) + " bytes long");
  }
  if (max_to_keep < 1) throw InvalidArgument("save_checkpoint: max_to_keep must be >= 1");
  const auto step = static_cast<std::uint64_t>(m.global_step);
  for (PsLink& l : m.links) {
    l.request = dir;
    m.channel->queue_send(l.rank, sp::envelope(PsKind::kSave, step, l.request.size()), nullptr,
                          0);
    m.channel->queue_send(l.rank, sp::envelope(PsKind::kData, step, l.request.size()),
                          l.request.data(), l.request.size());
    m.expect(l, PsKind::kSaved);
  }
  m.run("ps save", "the ps writes its shard file");
  if (const std::string why = m.failures(); !why.empty()) {
    throw CheckpointError("the checkpoint of step " + std::to_string(step) + " in " + dir +
                              " was not written: " + why,
                          sp::manifest_path(dir, step));
  }
  sp::Manifest mf;
  mf.checkpoint_step = step;
  for (PsLink& l : m.links) {
    const sp::ShardFileStamp st =
        sp::decode_saved(l.saved.data(), l.saved.size(), m.channel->with_peer(m.ctx("ps save"), l.rank));
    mf.entries.push_back({st.version, st.file_bytes, st.file_crc32});
  }
  sp::write_manifest(dir, mf);
  sp::remove_old_checkpoints(dir, static_cast<std::size_t>(max_to_keep));
  return sp::manifest_path(dir, step);
}

ParameterServerStats ParameterServerStrategy::join() {
  Impl& m = *impl_;
  if (!m.ps) throw InvalidUsage("join() on " + m.cluster.task_name() + ", not a ps task");
  strategy::ps::ServerConfig cfg;
  cfg.ps_index = m.cluster.task.index;
  for (int r = 0; r < m.cluster.num_workers; ++r) {
    cfg.workers.push_back(r);
    cfg.worker_names.push_back(m.job.cluster.task_name_of_rank(r) + " at " +
                               m.job.cluster.ring[static_cast<std::size_t>(r)]);
  }
  cfg.chief = 0;
  cfg.timeout_seconds = m.timeout;
  cfg.ctx = m.ctx("ps serve");
  strategy::ps::PsServer server(*m.channel, cfg);
  ParameterServerStats s = server.serve();
  m.stats = s;
  m.finalized = true;
  return s;
}

void ParameterServerStrategy::finalize() {
  Impl& m = *impl_;
  if (m.ps || m.finalized) return;
  m.finalized = true;
  if (m.links.empty()) return;
  const ErrorContext c = m.ctx("ps goodbye");
  for (PsLink& l : m.links) {
    if (m.channel->failed(l.rank)) continue;
    m.channel->queue_send(l.rank, strategy::ps::envelope(PsKind::kBye, 0, m.cluster.is_chief),
                          nullptr, 0);
  }
  auto last = common::Clock::now();
  for (;;) {
    bool idle = true;
    for (const PsLink& l : m.links) {
      if (m.channel->failed(l.rank)) m.throw_failure(l, c);
      idle = idle && m.channel->sends_idle(l.rank);
    }
    if (idle) return;
    if (m.channel->pump(c)) {
      last = common::Clock::now();
    } else if (since(last) > m.timeout) {
      throw TimeoutError("goodbye to the ps tasks not sent within the timeout", c);
    } else {
      m.channel->wait(0.05, c);
    }
  }
}

}  // namespace mwms
