/// @file session.h
/// A training session after TensorFlow 1's tf.compat.v1.train.MonitoredTrainingSession, for
/// both strategies: it creates the session (the chief initialises the variables or restores
/// the newest checkpoint; the other workers wait for it), runs the caller's training step
/// between hooks (StopAtStepHook, CheckpointSaverHook, LoggingHook, NanTensorHook, or the
/// caller's own SessionRunHook), saves checkpoints on the chief every save_checkpoint_steps
/// steps or save_checkpoint_secs seconds, and on a recoverable failure (a ps or a peer died or
/// went silent: PeerError, TimeoutError) reconnects the job and restores the newest checkpoint,
/// up to max_recoveries times (TF's _RecoverableSession retries without bound).
///
/// What the session drives is a SessionCreator: ParameterServerSessionCreator (mwms/
/// parameter_server.h's strategy, whose ps tasks hold the variables and write the checkpoint
/// shards) or the caller's own for the all-reduce strategy (the `train` example's keeps its
/// checkpoint file format).
///
/// @code
///   mwms::ParameterServerSessionCreator creator(cluster, options,
///       [&](mwms::ParameterServerStrategy& s) { declare_variables(s); });
///   if (creator.is_ps()) { creator.join(); return 0; }      // TF: server.join()
///   mwms::MonitoredTrainingSessionOptions o;
///   o.checkpoint_dir = "/shared/ckpt";
///   o.save_checkpoint_steps = 500;
///   o.hooks = {std::make_shared<mwms::StopAtStepHook>(0, 10000),
///              std::make_shared<mwms::NanTensorHook>()};
///   mwms::MonitoredTrainingSession session(creator, o);
///   while (!session.should_stop()) {
///     session.run([&](std::int64_t global_step) {
///       double loss = compute_gradients(global_step);       // from the values pulled last
///       creator.strategy().apply_gradients();
///       return loss;
///     });
///   }
///   session.close();   // the final checkpoint, then finalize(): the chief's ends the job
/// @endcode
///
/// Every decision that changes what a task does next is taken from the global step, never from a
/// clock, except the chief's save_checkpoint_secs (a save involves the chief and the ps tasks
/// only, never a collective of the workers).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "mwms/api.h"
#include "mwms/errors.h"

namespace mwms {

class MonitoredTrainingSession;

/// The loss a step returned was NaN or infinite (TF: tf.train.NanLossDuringTrainingError, raised
/// by NanTensorHook). Nothing is broken but the model: restore an older checkpoint or lower the
/// learning rate. Other workers of an all-reduce job then fail naming this one.
class MWMS_API NanLossDuringTrainingError : public Error { using Error::Error; };

/// What the session creates, saves and recreates (TF: a SessionCreator with its Scaffold's
/// init_op and Saver). Implementations connect the job, initialise or restore the variables and
/// write checkpoints; the session calls them from the caller's thread only.
class MWMS_API SessionCreator {
 public:
  virtual ~SessionCreator();
  /// Connects the job (again, after abandon()) and initialises the variables: the chief
  /// restores the newest usable checkpoint of `checkpoint_dir` (empty: none) or initialises
  /// them; the others wait for it. Collective over the job. Returns the global step.
  /// @throws as the strategy's connect and initialize (BootstrapError, PeerError, TimeoutError,
  ///   CheckpointError, ...).
  virtual std::int64_t create_session(const std::string& checkpoint_dir) = 0;
  /// Chief only: writes a checkpoint of every variable into `checkpoint_dir` at the current
  /// global step; returns its path. @throws CheckpointError, and as the strategy.
  virtual std::string save(const std::string& checkpoint_dir) = 0;
  /// The global step as this task last saw it.
  virtual std::int64_t global_step() const = 0;
  /// True when the chief, or worker 0 without a chief.
  virtual bool is_chief() const = 0;
  /// True once the job ended from elsewhere (ps mode: the chief finished): stop training.
  virtual bool job_ended() const { return false; }
  /// Orderly end of this task's part in the job (the strategy's finalize()).
  /// @throws as the strategy's finalize.
  virtual void close() = 0;
  /// Drops the connections after a failure, before create_session() runs again. Never throws.
  virtual void abandon() noexcept = 0;
};

/// What a hook sees around one step (TF: tf.estimator.SessionRunContext).
class MWMS_API SessionRunContext {
 public:
  /// The global step before the step runs.
  std::int64_t global_step() const noexcept { return global_step_; }
  /// The session (for its is_chief(), save_checkpoint(), ...).
  MonitoredTrainingSession& session() const noexcept { return *session_; }
  /// Ends the loop after this step: should_stop() becomes true (TF: request_stop()).
  void request_stop() noexcept { stop_requested_ = true; }
  /// True once request_stop() was called in this step.
  bool stop_requested() const noexcept { return stop_requested_; }

 private:
  friend class MonitoredTrainingSession;
  SessionRunContext(MonitoredTrainingSession& s, std::int64_t step)
      : session_(&s), global_step_(step) {}
  MonitoredTrainingSession* session_;
  std::int64_t global_step_;
  bool stop_requested_ = false;
};

/// What a step produced (TF: tf.estimator.SessionRunValues).
struct MWMS_API SessionRunValues {
  std::int64_t global_step = 0;  ///< after the step
  double loss = 0;               ///< what the step function returned (NaN after a recovery)
  /// The step failed and the session recovered: global_step is the restored step, and the
  /// step's work is lost (the caller repeats its input from global_step).
  bool recovered = false;
};

/// A hook into the session's loop (TF: tf.estimator.SessionRunHook). Every method runs on the
/// caller's thread; the default does nothing. A hook that throws ends the session's run() with
/// that exception (recovered from only when it is a PeerError or TimeoutError).
class MWMS_API SessionRunHook {
 public:
  virtual ~SessionRunHook();
  /// Once, before the session is first created.
  virtual void begin() {}
  /// After the variables were initialised or restored, and again after every recovery.
  virtual void after_create_session(MonitoredTrainingSession& session);
  /// Before each step, with the global step it starts from.
  virtual void before_run(SessionRunContext& context);
  /// After each step that completed (not after one the session recovered from), with what it
  /// produced; context.request_stop() ends the loop.
  virtual void after_run(SessionRunContext& context, const SessionRunValues& values);
  /// Once, from close(), before the creator closes (a last checkpoint belongs here).
  virtual void end(MonitoredTrainingSession& session);
};

/// Requests a stop once the global step reaches last_step (TF: tf.train.StopAtStepHook(num_steps,
/// last_step); exactly one of them > 0: num_steps counts from the step the session started or
/// was restored at, the first time it was created).
class MWMS_API StopAtStepHook : public SessionRunHook {
 public:
  /// @throws InvalidArgument unless exactly one of num_steps and last_step is positive.
  StopAtStepHook(std::int64_t num_steps, std::int64_t last_step);
  /// Fixes last_step from num_steps (the first time); a session created at or past it stops.
  void after_create_session(MonitoredTrainingSession& session) override;
  /// Requests the stop once values.global_step >= last_step.
  void after_run(SessionRunContext& context, const SessionRunValues& values) override;
  /// The global step at which the session stops (after the first after_create_session()).
  std::int64_t last_step() const noexcept { return last_step_; }

 private:
  std::int64_t num_steps_;
  std::int64_t last_step_;
};

/// Saves a checkpoint every save_steps global steps or save_secs seconds (TF:
/// tf.train.CheckpointSaverHook; exactly one of them > 0): after the session is created (a fresh
/// start's step 0, so a restart never begins from nothing), after each step that crosses the
/// next multiple of save_steps (or once save_secs passed since the last save), and at end().
/// The chief's only (MonitoredTrainingSession adds it there). A failed save (CheckpointError:
/// disk full, ...) is logged at warn and training goes on; the next save tries again.
class MWMS_API CheckpointSaverHook : public SessionRunHook {
 public:
  /// @throws InvalidArgument for an empty directory, or unless exactly one of save_steps and
  ///   save_secs is positive.
  CheckpointSaverHook(std::string checkpoint_dir, std::int64_t save_steps, double save_secs);
  /// A fresh start (global step 0) saves; a restored or recovered one has its step on disk.
  void after_create_session(MonitoredTrainingSession& session) override;
  /// Saves when the step crossed the next multiple of save_steps, or save_secs passed.
  void after_run(SessionRunContext& context, const SessionRunValues& values) override;
  /// The last checkpoint (unless this step is already saved).
  void end(MonitoredTrainingSession& session) override;
  /// Checkpoints written so far.
  int saves() const noexcept { return saves_; }
  /// The path of the newest checkpoint written ("" before the first).
  const std::string& last_path() const noexcept { return last_path_; }

 private:
  void save(MonitoredTrainingSession& session, std::int64_t step);
  std::string dir_;
  std::int64_t save_steps_;
  double save_secs_;
  std::int64_t last_good_step_ = -1;     // the step of the newest checkpoint written
  std::int64_t last_attempt_step_ = -1;  // the step of the last save tried (a failed one too)
  std::chrono::steady_clock::time_point last_save_time_;
  int saves_ = 0;
  std::string last_path_;
};

/// Reports "step N: loss L (S steps/s)" every every_n_steps steps (TF: tf.train.LoggingTensorHook
/// with every_n_iter, and StepCounterHook's rate) through `sink` (default: one line on stderr).
class MWMS_API LoggingHook : public SessionRunHook {
 public:
  /// Receives each report line (no newline).
  using Sink = std::function<void(const std::string& line)>;
  /// @throws InvalidArgument for every_n_steps < 1.
  explicit LoggingHook(std::int64_t every_n_steps, Sink sink = {});
  /// Restarts the rate's clock and step (also after a recovery).
  void after_create_session(MonitoredTrainingSession& session) override;
  /// Every every_n_steps-th step: one line to the sink.
  void after_run(SessionRunContext& context, const SessionRunValues& values) override;

 private:
  std::int64_t every_;
  Sink sink_;
  std::int64_t runs_ = 0;
  std::int64_t last_step_ = 0;
  std::chrono::steady_clock::time_point last_time_;
};

/// Checks every step's loss (TF: tf.train.NanTensorHook(loss, fail_on_nan_loss)): on NaN or
/// infinity it throws NanLossDuringTrainingError naming the step (fail_on_nan_loss), or logs a
/// warning and requests a stop.
class MWMS_API NanTensorHook : public SessionRunHook {
 public:
  /// `fail_on_nan_loss`: throw (TF's default) rather than stop.
  explicit NanTensorHook(bool fail_on_nan_loss = true) : fail_(fail_on_nan_loss) {}
  /// Checks values.loss. @throws NanLossDuringTrainingError when it is not finite and
  ///   fail_on_nan_loss.
  void after_run(SessionRunContext& context, const SessionRunValues& values) override;

 private:
  bool fail_;
};

/// MonitoredTrainingSession's arguments, in TF's names.
struct MWMS_API MonitoredTrainingSessionOptions {
  /// Where the chief saves checkpoints and restores from; empty: neither.
  std::string checkpoint_dir;
  /// The chief's CheckpointSaverHook: every this many global steps...
  std::int64_t save_checkpoint_steps = 0;
  /// ... or seconds. Both 0 with a checkpoint_dir: every 600 s (TF's default).
  double save_checkpoint_secs = 0;
  /// The chief's LoggingHook every this many steps; 0: none (TF: log_step_count_steps, 100).
  std::int64_t log_step_count_steps = 0;
  /// Recoveries allowed (reconnect, restore, go on); 0: a failure ends the session.
  int max_recoveries = 0;
  /// Hooks of every task, run in order, then chief_only_hooks on the chief (TF's arguments).
  std::vector<std::shared_ptr<SessionRunHook>> hooks;
  /// Hooks run on the chief only (after `hooks`).
  std::vector<std::shared_ptr<SessionRunHook>> chief_only_hooks;
};

/// The session: see the file comment. One per task (workers and the chief; ps tasks join()).
/// Thread safety: one thread at a time.
class MWMS_API MonitoredTrainingSession {
 public:
  /// Runs every hook's begin(), creates the session (creator.create_session(checkpoint_dir)),
  /// then after_create_session(). Collective over the job (as create_session). Keeps a
  /// reference to `creator`: it must outlive the session.
  /// @throws InvalidArgument (bad options), and what create_session throws (recovered from as
  ///   run() does when it is a PeerError or TimeoutError and max_recoveries allows).
  MonitoredTrainingSession(SessionCreator& creator, MonitoredTrainingSessionOptions options = {});
  /// Ends without close() when the caller did not call it (after an exception): abandons the
  /// job (peers see this task lost). Never throws.
  ~MonitoredTrainingSession();
  MonitoredTrainingSession(const MonitoredTrainingSession&) = delete;
  MonitoredTrainingSession& operator=(const MonitoredTrainingSession&) = delete;

  /// One training step: every hook's before_run(), `step(global_step)` (the caller's step: it
  /// computes and applies the gradients and returns the loss), every hook's after_run() with the
  /// creator's global step after it. On a PeerError or TimeoutError from the step or a hook,
  /// while recoveries are left: logs it at warn, abandons the job, creates the session again
  /// (the chief restores the newest checkpoint), runs after_create_session() and returns the
  /// restored step with a NaN loss (no hook's after_run() sees it). Blocking as the step.
  /// @throws InvalidUsage (after should_stop() or close()), the step's or a hook's exception
  ///   otherwise (NanLossDuringTrainingError from NanTensorHook).
  SessionRunValues run(const std::function<double(std::int64_t global_step)>& step);

  /// True once a hook requested a stop or the job ended (TF: should_stop()).
  bool should_stop() const noexcept;
  /// Makes should_stop() true (a hook outside run(), e.g. StopAtStepHook when the session is
  /// created at or past its last step).
  void request_stop() noexcept { stop_ = true; }
  /// Hooks' end() (the chief's last checkpoint), then the creator's close(). Idempotent.
  /// @throws what a hook's end() or the creator's close() throws.
  void close();

  /// The creator's is_chief(): the chief, or worker 0 without a chief.
  bool is_chief() const noexcept;
  /// The global step as this task last saw it (the creator's).
  std::int64_t global_step() const noexcept;
  /// Recoveries done so far.
  int recoveries() const noexcept { return recoveries_; }
  /// The options as given.
  const MonitoredTrainingSessionOptions& options() const noexcept { return options_; }
  /// Chief only: a checkpoint now, into options().checkpoint_dir. Returns its path.
  /// @throws InvalidUsage (no checkpoint_dir, not the chief), CheckpointError, and as the
  ///   creator's save.
  std::string save_checkpoint();
  /// The global step the session was last created or restored at.
  std::int64_t created_at_step() const noexcept { return created_at_; }

 private:
  template <class F>
  void for_hooks(F f);
  void create();
  bool recover(const Error& e);

  SessionCreator& creator_;
  MonitoredTrainingSessionOptions options_;
  std::vector<std::shared_ptr<SessionRunHook>> all_hooks_;
  bool stop_ = false;
  bool closed_ = false;
  int recoveries_ = 0;
  std::int64_t created_at_ = 0;
};

}  // namespace mwms
