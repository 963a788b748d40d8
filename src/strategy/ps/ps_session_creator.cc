// ParameterServerSessionCreator (mwms/parameter_server.h): a parameter-server job under a
// MonitoredTrainingSession, and its recovery (Note [session recovery] in strategy/session.cc).
#include "common/logging.h"
#include "mwms/parameter_server.h"
#include "strategy/ps/ps_checkpoint.h"

namespace mwms {

std::string latest_checkpoint(const std::string& checkpoint_dir) {
  const std::vector<std::uint64_t> steps = strategy::ps::list_checkpoints(checkpoint_dir);
  return steps.empty() ? std::string() : strategy::ps::manifest_path(checkpoint_dir, steps[0]);
}

ParameterServerSessionCreator::ParameterServerSessionCreator(ResolvedCluster cluster,
                                                             ParameterServerOptions options,
                                                             DeclareVariables declare_variables,
                                                             int max_to_keep)
    : cluster_(std::move(cluster)),
      options_(std::move(options)),
      declare_(std::move(declare_variables)),
      max_to_keep_(max_to_keep) {
  if (max_to_keep < 1) throw InvalidArgument("max_to_keep must be >= 1");
  if (!is_ps() && !declare_) {
    throw InvalidArgument("ParameterServerSessionCreator on " + cluster_.task_name() +
                          " needs a declare_variables function");
  }
}

ParameterServerSessionCreator::~ParameterServerSessionCreator() = default;

bool ParameterServerSessionCreator::is_ps() const noexcept { return cluster_.task.type == "ps"; }

ParameterServerStrategy& ParameterServerSessionCreator::strategy() {
  if (!strategy_) throw InvalidUsage("strategy() before create_session()");
  return *strategy_;
}

ParameterServerStats ParameterServerSessionCreator::join(int max_recoveries) {
  if (!is_ps()) throw InvalidUsage("join() on " + cluster_.task_name() + ", not a ps task");
  std::vector<std::string> lost;
  for (int recoveries = 0;; ++recoveries) {
    try {
      strategy_ = std::make_unique<ParameterServerStrategy>(cluster_, options_);
      ParameterServerStats stats = strategy_->join();
      stats.lost_workers.insert(stats.lost_workers.begin(), lost.begin(), lost.end());
      return stats;
    } catch (const Error& e) {
      const bool peer = dynamic_cast<const BootstrapError*>(&e) == nullptr &&
                        (dynamic_cast<const PeerError*>(&e) != nullptr ||
                         dynamic_cast<const TimeoutError*>(&e) != nullptr);
      if (!peer || recoveries >= max_recoveries) throw;
      ParameterServerStats partial = strategy_ ? strategy_->stats() : ParameterServerStats{};
      lost.insert(lost.end(), partial.lost_workers.begin(), partial.lost_workers.end());
      MWMS_LOG_WARN(kStrat, cluster_.task_name() << ": the job failed (" << e.what()
                                                 << "); connecting again for its recovery ("
                                                 << recoveries + 1 << " of " << max_recoveries
                                                 << ")");
      strategy_.reset();
    }
  }
}

std::int64_t ParameterServerSessionCreator::create_session(const std::string& checkpoint_dir) {
  if (is_ps()) throw InvalidUsage("create_session() on " + cluster_.task_name() + ", a ps task");
  strategy_.reset();  // after abandon() there is none; a second call starts over
  strategy_ = std::make_unique<ParameterServerStrategy>(cluster_, options_);
  declare_(*strategy_);
  last_step_ = strategy_->initialize(checkpoint_dir);
  return last_step_;
}

std::string ParameterServerSessionCreator::save(const std::string& checkpoint_dir) {
  return strategy().save_checkpoint(checkpoint_dir, max_to_keep_);
}

std::int64_t ParameterServerSessionCreator::global_step() const {
  return strategy_ ? strategy_->global_step() : last_step_;
}

bool ParameterServerSessionCreator::is_chief() const { return cluster_.is_chief; }

bool ParameterServerSessionCreator::job_ended() const {
  return strategy_ != nullptr && strategy_->should_stop();
}

void ParameterServerSessionCreator::close() {
  if (strategy_) strategy_->finalize();
}

void ParameterServerSessionCreator::abandon() noexcept {
  if (strategy_) last_step_ = strategy_->global_step();
  strategy_.reset();  // closes the links: every ps sees this worker lost
}

}  // namespace mwms
