// MonitoredTrainingSession and its hooks (mwms/session.h), after TF 1's
// tensorflow/python/training/monitored_session.py and basic_session_run_hooks.py.
//
// Note [session recovery]: TF's _RecoverableSession recreates the session when a step raises
// AbortedError or UnavailableError (a ps restarted, a worker lost); here the recoverable kinds are
// PeerError and TimeoutError, the errors a lost or silent peer produces. Recovery abandons every
// connection (peers see this task lost and fail or recover themselves), then creates the session
// again: a new rendezvous of the whole job (the restarted task joins it), and the chief restores
// the newest checkpoint, so every task continues from the same saved state. The step that failed
// is not retried: its gradient may or may not have been applied, and the checkpoint decides.
#include "mwms/session.h"

#include <cmath>
#include <cstdio>
#include <iostream>
#include <sstream>

#include "common/logging.h"

namespace mwms {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// A bootstrap deadline (BootstrapTimeoutError, also a TimeoutError) means the job could not be
// formed: not a failure inside a running job, so never recovered from.
bool recoverable(const Error& e) {
  if (dynamic_cast<const BootstrapError*>(&e) != nullptr) return false;
  return dynamic_cast<const PeerError*>(&e) != nullptr ||
         dynamic_cast<const TimeoutError*>(&e) != nullptr;
}

}  // namespace

SessionCreator::~SessionCreator() = default;
SessionRunHook::~SessionRunHook() = default;
void SessionRunHook::after_create_session(MonitoredTrainingSession&) {}
void SessionRunHook::before_run(SessionRunContext&) {}
void SessionRunHook::after_run(SessionRunContext&, const SessionRunValues&) {}
void SessionRunHook::end(MonitoredTrainingSession&) {}

// ---- StopAtStepHook ----

StopAtStepHook::StopAtStepHook(std::int64_t num_steps, std::int64_t last_step)
    : num_steps_(num_steps), last_step_(last_step) {
  if ((num_steps > 0) == (last_step > 0) || num_steps < 0 || last_step < 0) {
    throw InvalidArgument("StopAtStepHook: exactly one of num_steps (" +
                          std::to_string(num_steps) + ") and last_step (" +
                          std::to_string(last_step) + ") must be positive");
  }
}

void StopAtStepHook::after_create_session(MonitoredTrainingSession& session) {
  // TF computes last_step = global_step + num_steps once, when the session is first created; a
  // recovery restores an older step but the goal stays.
  if (num_steps_ > 0) {
    last_step_ = session.global_step() + num_steps_;
    num_steps_ = 0;
  }
  if (session.global_step() >= last_step_) session.request_stop();
}

void StopAtStepHook::after_run(SessionRunContext& context, const SessionRunValues& values) {
  if (values.global_step >= last_step_) context.request_stop();
}

// ---- CheckpointSaverHook ----

CheckpointSaverHook::CheckpointSaverHook(std::string checkpoint_dir, std::int64_t save_steps,
                                         double save_secs)
    : dir_(std::move(checkpoint_dir)), save_steps_(save_steps), save_secs_(save_secs) {
  if (dir_.empty()) throw InvalidArgument("CheckpointSaverHook: checkpoint_dir is empty");
  if ((save_steps > 0) == (save_secs > 0) || save_steps < 0 || !(save_secs >= 0) ||
      !std::isfinite(save_secs)) {
    throw InvalidArgument("CheckpointSaverHook: exactly one of save_steps (" +
                          std::to_string(save_steps) + ") and save_secs (" +
                          std::to_string(save_secs) + ") must be positive");
  }
}

void CheckpointSaverHook::save(MonitoredTrainingSession& session, std::int64_t step) {
  if (step == last_good_step_) return;  // already saved at this step
  last_attempt_step_ = step;
  try {
    last_path_ = session.save_checkpoint();
    ++saves_;
    last_good_step_ = step;
    last_save_time_ = std::chrono::steady_clock::now();
    MWMS_LOG_INFO(kStrat, "saved checkpoint " << last_path_ << " (global step " << step << ")");
  } catch (const CheckpointError& e) {
    // Disk full, a directory gone: nothing else is broken; the next save tries again.
    last_save_time_ = std::chrono::steady_clock::now();
    MWMS_LOG_WARN(kStrat, "checkpoint of global step " << step << " not written: " << e.what());
  }
}

void CheckpointSaverHook::after_create_session(MonitoredTrainingSession& session) {
  // TF saves right after the session is created; a restored session already has this step on
  // disk, so only a fresh start writes one.
  last_save_time_ = std::chrono::steady_clock::now();
  const std::int64_t step = session.global_step();
  if (session.recoveries() == 0 && last_attempt_step_ < 0 && step == 0) {
    save(session, step);
  } else {
    last_good_step_ = last_attempt_step_ = step;
  }
}

void CheckpointSaverHook::after_run(SessionRunContext& context, const SessionRunValues& values) {
  const std::int64_t step = values.global_step;
  bool due;
  if (save_steps_ > 0) {
    // The step crossed the next multiple of save_steps since the last save (asynchronous ps
    // steps advance the global step by the other workers' pushes too).
    due = last_attempt_step_ < 0 || step / save_steps_ > last_attempt_step_ / save_steps_;
  } else {
    due = seconds_since(last_save_time_) >= save_secs_;
  }
  if (due) save(context.session(), step);
}

void CheckpointSaverHook::end(MonitoredTrainingSession& session) {
  save(session, session.global_step());
}

// ---- LoggingHook ----

LoggingHook::LoggingHook(std::int64_t every_n_steps, Sink sink)
    : every_(every_n_steps), sink_(std::move(sink)) {
  if (every_n_steps < 1) {
    throw InvalidArgument("LoggingHook: every_n_steps must be >= 1, got " +
                          std::to_string(every_n_steps));
  }
  if (!sink_) {
    sink_ = [](const std::string& line) { std::cerr << line << std::endl; };
  }
}

void LoggingHook::after_create_session(MonitoredTrainingSession& session) {
  runs_ = 0;
  last_step_ = session.global_step();
  last_time_ = std::chrono::steady_clock::now();
}

void LoggingHook::after_run(SessionRunContext&, const SessionRunValues& values) {
  if (++runs_ % every_ != 0) return;
  const double secs = seconds_since(last_time_);
  const double rate = secs > 0 ? static_cast<double>(values.global_step - last_step_) / secs : 0;
  char line[160];
  std::snprintf(line, sizeof line, "step %lld: loss %.4f (%.1f global steps/s)",
                static_cast<long long>(values.global_step), values.loss, rate);
  sink_(line);
  last_step_ = values.global_step;
  last_time_ = std::chrono::steady_clock::now();
}

// ---- NanTensorHook ----

void NanTensorHook::after_run(SessionRunContext& context, const SessionRunValues& values) {
  if (std::isfinite(values.loss)) return;
  const std::string what = "the loss is " + std::string(std::isnan(values.loss) ? "NaN" : "infinite") +
                           " after global step " + std::to_string(values.global_step);
  if (fail_) throw NanLossDuringTrainingError("model diverged with loss = NaN: " + what);
  MWMS_LOG_WARN(kStrat, what << "; stopping (NanTensorHook with fail_on_nan_loss false)");
  context.request_stop();
}

// ---- MonitoredTrainingSession ----

template <class F>
void MonitoredTrainingSession::for_hooks(F f) {
  for (const std::shared_ptr<SessionRunHook>& h : all_hooks_) f(*h);
}

MonitoredTrainingSession::MonitoredTrainingSession(SessionCreator& creator,
                                                   MonitoredTrainingSessionOptions options)
    : creator_(creator), options_(std::move(options)) {
  if (options_.max_recoveries < 0) {
    throw InvalidArgument("max_recoveries must be >= 0, got " +
                          std::to_string(options_.max_recoveries));
  }
  if (options_.save_checkpoint_steps < 0 || !(options_.save_checkpoint_secs >= 0)) {
    throw InvalidArgument("save_checkpoint_steps and save_checkpoint_secs must be >= 0");
  }
  for (const auto& h : options_.hooks) {
    if (!h) throw InvalidArgument("a null hook in hooks");
    all_hooks_.push_back(h);
  }
  if (creator_.is_chief()) {
    for (const auto& h : options_.chief_only_hooks) {
      if (!h) throw InvalidArgument("a null hook in chief_only_hooks");
      all_hooks_.push_back(h);
    }
    // TF's MonitoredTrainingSession adds these two to the chief's hooks itself.
    if (!options_.checkpoint_dir.empty()) {
      const bool secs = options_.save_checkpoint_steps == 0;
      all_hooks_.push_back(std::make_shared<CheckpointSaverHook>(
          options_.checkpoint_dir, options_.save_checkpoint_steps,
          secs ? (options_.save_checkpoint_secs > 0 ? options_.save_checkpoint_secs : 600.0)
               : 0.0));
    }
    if (options_.log_step_count_steps > 0) {
      all_hooks_.push_back(std::make_shared<LoggingHook>(options_.log_step_count_steps));
    }
  }
  for_hooks([](SessionRunHook& h) { h.begin(); });
  create();
}

MonitoredTrainingSession::~MonitoredTrainingSession() {
  if (!closed_) creator_.abandon();
}

// Creates the session, again after each recoverable failure while recoveries are left.
void MonitoredTrainingSession::create() {
  for (;;) {
    try {
      created_at_ = creator_.create_session(options_.checkpoint_dir);
      for_hooks([this](SessionRunHook& h) { h.after_create_session(*this); });
      return;
    } catch (const Error& e) {
      if (!recover(e)) throw;
    }
  }
}

// Note [session recovery]. Returns false when `e` ends the session.
bool MonitoredTrainingSession::recover(const Error& e) {
  if (!recoverable(e)) return false;
  if (recoveries_ >= options_.max_recoveries) {
    if (options_.max_recoveries > 0) {
      MWMS_LOG_WARN(kStrat, "no recovery left (max_recoveries " << options_.max_recoveries
                                                                << " used): " << e.what());
    }
    return false;
  }
  ++recoveries_;
  MWMS_LOG_WARN(kStrat, "recovering (" << recoveries_ << " of " << options_.max_recoveries
                                       << "): " << e.what()
                                       << "; reconnecting the job and restoring the newest "
                                          "checkpoint");
  creator_.abandon();
  return true;
}

SessionRunValues MonitoredTrainingSession::run(
    const std::function<double(std::int64_t global_step)>& step) {
  if (closed_) throw InvalidUsage("run() after close()");
  if (should_stop()) throw InvalidUsage("run() after should_stop() became true");
  SessionRunContext ctx(*this, creator_.global_step());
  try {
    for_hooks([&](SessionRunHook& h) { h.before_run(ctx); });
    SessionRunValues values;
    values.loss = step(ctx.global_step());
    values.global_step = creator_.global_step();
    for_hooks([&](SessionRunHook& h) { h.after_run(ctx, values); });
    stop_ = stop_ || ctx.stop_requested();
    return values;
  } catch (const Error& e) {
    if (!recover(e)) throw;
  }
  create();
  SessionRunValues values;
  values.global_step = created_at_;
  values.loss = std::nan("");
  values.recovered = true;
  return values;
}

bool MonitoredTrainingSession::should_stop() const noexcept {
  return stop_ || creator_.job_ended();
}

void MonitoredTrainingSession::close() {
  if (closed_) return;
  closed_ = true;
  try {
    for_hooks([this](SessionRunHook& h) { h.end(*this); });
  } catch (...) {
    creator_.abandon();
    throw;
  }
  creator_.close();
}

bool MonitoredTrainingSession::is_chief() const noexcept { return creator_.is_chief(); }
std::int64_t MonitoredTrainingSession::global_step() const noexcept {
  return creator_.global_step();
}

std::string MonitoredTrainingSession::save_checkpoint() {
  if (options_.checkpoint_dir.empty()) {
    throw InvalidUsage("save_checkpoint(): the session has no checkpoint_dir");
  }
  if (!creator_.is_chief()) throw InvalidUsage("save_checkpoint(): only the chief saves");
  return creator_.save(options_.checkpoint_dir);
}

}  // namespace mwms
