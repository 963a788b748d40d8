// ParameterServerStrategy (mwms/parameter_server.h): the worker side of the protocol of
// ps_protocol.h, and the ps side through PsServer. This file holds the construction (the options'
// checks, the job's connection: Note [ps job mesh] below, Note [ps spin]), the accessors, a ps
// task's join() and the workers' finalize(); the state is parameter_server_strategy_impl.h, which
// lists the files that hold the rest (variables, the pull/push step, checkpoints).
//
// Note [ps job mesh]: a parameter-server job is one mesh of every training task and every ps
// task: ranks 0..W-1 are the chief and the workers as in an all-reduce ring, ranks W..W+P-1 the
// ps tasks in list order (Note [ps rank] in bootstrap/tf_config.cc). It is connected exactly as a
// Communicator is (collective::connect_job: rendezvous, peer-info exchange, one link per pair over
// shared memory, TCP or MPI, control plane and heartbeat, MWMS_AUTH_KEY), so a ps and its workers
// get the deadlines, death notices and authentication that collectives have.
#include <algorithm>
#include <string>
#include <utility>

#include "collective/communicator_factory.h"
#include "collective/engine/message_channel.h"
#include "common/env.h"
#include "common/logging.h"
#include "mwms/parameter_server.h"
#include "strategy/ps/parameter_server_strategy_impl.h"
#include "strategy/ps/ps_protocol.h"
#include "strategy/ps/ps_server.h"

namespace mwms {

namespace {

using strategy::ps::PsKind;
using strategy::ps::detail::PsLink;
using strategy::ps::detail::since;

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

}  // namespace

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
  for (int r = 0; r < m.cluster.num_workers; ++r) {
    const auto& link = m.job.links[static_cast<std::size_t>(r)];
    cfg.worker_shm.push_back(link != nullptr && std::string(link->caps().name) == "shm");
  }
  // Note [ps shared values] (ps_shared_values.h).
  cfg.shared_values = common::env_string("MWMS_PS_SHARED_VALUES") != "0";
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
