/// @file parameter_server.h
/// Parameter-server training, after TensorFlow 1's distributed job (tf.train.Server +
/// replica_device_setter + SyncReplicasOptimizer) and TF 2's ParameterServerStrategy: ps tasks
/// hold the variables, sharded and placed by TF's rules (mwms/ps_placement.h), and run the
/// optimizer (mwms/optimizer.h) on the shards they hold; workers pull the variables, compute
/// gradients and push them. Two modes:
/// - synchronous (SyncReplicasOptimizer(replicas_to_aggregate, total_num_replicas)): every global
///   step averages exactly replicas_to_aggregate gradients computed on that step; a gradient
///   computed on an older step is dropped (counted); every worker starts the next step from the
///   same parameters. With total_num_replicas > replicas_to_aggregate (backup workers) the
///   slowest worker's gradient is dropped and nobody waits for it.
/// - asynchronous (TF 1's default): each push is applied when it arrives; the staleness of each
///   applied gradient (updates the ps applied since that worker pulled) is measured. An optional
///   bound (max_staleness, stale-synchronous parallel) makes a worker that is too far ahead wait.
///
/// Every task of the cluster (chief, workers, ps) constructs a ParameterServerStrategy from the
/// same cluster: the constructor runs the rendezvous over all of them and connects each worker
/// to every ps over the links a Communicator uses (shared memory on one host, TCP across hosts,
/// MPI with MWMS_TRANSPORT=mpi), with the same deadlines, heartbeat and MWMS_AUTH_KEY.
///
/// @code
///   mwms::ParameterServerStrategy ps(mwms::resolve_from_environment(), options);
///   if (ps.is_ps()) { ps.join(); return 0; }            // TF: server.join()
///   ps.create_variable({"dense/kernel", {784, 256}}, w, dw);  // every worker, same order
///   ps.create_variable({"dense/bias", {256}}, b, db);
///   ps.initialize();            // the chief's values become the variables; others wait
///   while (!ps.should_stop()) {
///     compute_gradients(w, b, dw, db);                 // from the values pulled last
///     ps.apply_gradients();     // push dw, db to their ps; pull the new w, b
///   }
///   ps.finalize();              // goodbye; the chief's ends the job and stops the ps tasks
/// @endcode
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mwms/api.h"
#include "mwms/cluster.h"
#include "mwms/optimizer.h"
#include "mwms/options.h"
#include "mwms/ps_placement.h"
#include "mwms/session.h"

namespace mwms {

/// Options of a ParameterServerStrategy. Every task must use the same (the ps checks the
/// workers' against the chief's and refuses a worker that differs, naming the field).
struct MWMS_API ParameterServerOptions {
  /// Which ps gets each variable shard (replica_device_setter's ps_strategy).
  PsPlacement placement = PsPlacement::kRoundRobin;
  /// How variables are split along axis 0 (tf.compat.v1 partitioners); none by default.
  Partitioner partitioner;
  /// The optimizer the ps tasks run on the shards they hold, with its slots.
  OptimizerOptions optimizer;
  /// Synchronous mode (SyncReplicasOptimizer); false: asynchronous.
  bool sync_replicas = false;
  /// Synchronous mode: gradients averaged per global step; 0: every worker (num_workers()).
  int replicas_to_aggregate = 0;
  /// Synchronous mode: workers computing gradients; 0: every worker. Must equal the number of
  /// training tasks when given (backup workers: total_num_replicas > replicas_to_aggregate).
  int total_num_replicas = 0;
  /// Asynchronous mode: a worker whose pushes are more than this many ahead of the slowest live
  /// worker waits (stale-synchronous parallel); -1: no bound.
  int max_staleness = -1;
  /// Deadline of every wait for a peer, in seconds, > 0. Unset: MWMS_TIMEOUT_SECONDS (<= 0
  /// still means unset, deprecated: Note [option sentinels], mwms/options.h). A synchronous
  /// worker waiting for its step, or an SSP worker held back, waits at most this long without
  /// any progress of the job before failing with TimeoutError.
  std::optional<double> timeout_seconds;
  /// How long the rendezvous keeps trying to reach every task, in seconds, > 0. Unset:
  /// MWMS_CONNECT_TIMEOUT_SECONDS (<= 0 still means unset, deprecated).
  std::optional<double> connect_timeout_seconds;
  /// Transport of the links. Unset: MWMS_TRANSPORT (default auto).
  std::optional<TransportChoice> transport;
};

/// What a task measured (workers: their own pushes; ps: what it served). Counters only grow.
struct MWMS_API ParameterServerStats {
  std::int64_t global_step = 0;      ///< updates applied (ps 0's count, as TF's global_step)
  std::int64_t pushes = 0;           ///< gradients pushed (worker) or received (ps)
  std::int64_t applied = 0;          ///< gradients applied (async) or aggregated (sync)
  std::int64_t dropped_stale = 0;    ///< gradients dropped as computed on an older step (sync)
  /// ps: gradients never applied because the chief ended the job first (a worker's push
  /// crossing the chief's goodbye; synchronous: those of the step that never completed). Once
  /// the ps served the whole job, pushes = applied + dropped_stale + after_end, but for pushes
  /// cut off by a lost worker.
  std::int64_t after_end = 0;
  std::int64_t held_back = 0;        ///< replies delayed by max_staleness (ps, async)
  /// Staleness of every applied gradient (async; sync: 0 for all): staleness_histogram[s] counts
  /// gradients applied s updates after the worker pulled (the last bucket: that many or more).
  std::vector<std::int64_t> staleness_histogram;
  /// Bytes of gradients sent to (worker) / received from workers by (ps) each ps, by ps index.
  std::vector<std::uint64_t> bytes_pushed;
  /// Bytes of variables received from (worker) / sent by (ps) each ps, by ps index.
  std::vector<std::uint64_t> bytes_pulled;
  std::vector<std::string> lost_workers;  ///< ps: workers it lost (died, or frozen), by name
  /// Replies whose values went through the ps's shared memory instead of the link (ps: sent;
  /// worker: copied), synchronous mode on one host: MWMS_PS_SHARED_VALUES in docs/env.md.
  std::int64_t shared_value_replies = 0;
};

/// Parameter-server training: see the file comment. One object per process, on every task of
/// the cluster. Thread safety: one thread at a time. Every blocking call waits under the
/// timeout (ParameterServerOptions::timeout_seconds) and fails naming the task it waited for.
class MWMS_API ParameterServerStrategy {
 public:
  /// Connects this task to the job: the rendezvous of every chief, worker and ps task, then links
  /// between them. Blocks up to the connect timeout.
  /// @throws BootstrapError (no ps job in the cluster, an evaluator, a peer that never came up,
  ///   naming it), InvalidArgument (bad options: replicas_to_aggregate out of range, an optimizer
  ///   option), BackendError.
  ParameterServerStrategy(const ResolvedCluster& cluster, ParameterServerOptions options = {});
  /// Closes the links. A worker destroyed without finalize() is seen by the ps as lost. Never
  /// throws.
  ~ParameterServerStrategy();
  ParameterServerStrategy(const ParameterServerStrategy&) = delete;
  ParameterServerStrategy& operator=(const ParameterServerStrategy&) = delete;

  bool is_ps() const noexcept;        ///< this task is a ps: call join()
  bool is_chief() const noexcept;     ///< the chief, or worker 0 without a chief
  int num_workers() const noexcept;   ///< training tasks (chief + workers)
  int num_ps() const noexcept;        ///< ps tasks
  /// This worker's index among the training tasks (its TF task id), -1 on a ps.
  int worker_index() const noexcept;
  const ResolvedCluster& cluster() const noexcept;  ///< as resolved (before the job mesh)
  /// The options, with replicas_to_aggregate and total_num_replicas resolved (never 0).
  const ParameterServerOptions& options() const noexcept;

  /// Declares a float32 variable (worker tasks only; every worker declares the same variables in
  /// the same order, before initialize()). `value` and `gradient` point at the worker's copy of
  /// the variable and at its gradient, each product(spec.shape) floats, caller-owned and valid
  /// until finalize(): initialize()/pull()/apply_gradients() overwrite `value` with the ps's
  /// values; apply_gradients() reads `gradient`. On the chief, `initializer` (when given) fills
  /// `value` at initialize() and the result is the variable's initial value; without one, the
  /// chief's `value` at initialize() is. Returns the variable's index.
  /// @throws InvalidArgument (a dtype other than float32, an empty or duplicate name, a null
  ///   pointer with elements, a negative dimension), InvalidUsage (on a ps, after initialize()).
  int create_variable(const VariableSpec& spec, float* value, float* gradient,
                      std::function<void(float* value, std::size_t count)> initializer = {});

  /// The shards and the ps each is on, as placed (valid after initialize()).
  const std::vector<VariableShard>& placement() const noexcept;

  /// Worker tasks, collective over the job: the chief sends the variables' initial values (and
  /// the options) to every ps; every other worker waits until the chief did (at most the
  /// timeout), checking that it declared the same variables and options. Then every worker pulls
  /// the values. Returns the global step (0 for a fresh job).
  ///
  /// With a `checkpoint_dir` holding checkpoints (save_checkpoint), the chief restores the
  /// newest usable one instead (TF: the chief's Saver.restore in MonitoredTrainingSession): it
  /// verifies the manifest and every shard file (checksums, sizes, and that they hold exactly
  /// the shards and optimizer slots this job places on each ps), falls back to an older
  /// checkpoint with a warning when the newest is unusable, then every ps reads its own shard
  /// file: values, optimizer slots and global step continue where the checkpoint left them.
  /// Other workers pass nothing: they wait as for a fresh start. An empty or absent directory,
  /// or one without checkpoints, is a fresh start.
  /// @throws CollectiveMismatchError (a worker's variables or options differ from the chief's,
  ///   naming the first difference), PeerError/TimeoutError (a ps or the chief failed, naming
  ///   it), CheckpointError (the chief: the directory holds checkpoints and none is usable, each
  ///   one's reason in the message; or a ps could not read its file, naming the ps),
  ///   InvalidUsage (on a ps, twice).
  std::int64_t initialize(const std::string& checkpoint_dir = {});

  /// The manifest initialize() restored (`<dir>/model.ckpt-<step>.manifest`), empty after a
  /// fresh start and on workers other than the chief.
  const std::string& restored_from() const noexcept;

  /// Chief only: a checkpoint of every variable and its optimizer slots at the global step of
  /// the last reply (TF: Saver(sharded=True).save by the chief's CheckpointSaverHook). Every ps
  /// writes the shards it holds to `<dir>/model.ckpt-<step>.ps-<i>-of-<n>` (atomically: a
  /// temporary file, fsync, rename), then the chief writes `<dir>/model.ckpt-<step>.manifest`
  /// naming each file's size and CRC32; a checkpoint exists once its manifest does. Keeps the
  /// `max_to_keep` newest checkpoints (TF's Saver default: 5) and removes older ones. Every ps
  /// writes into its own view of `dir`: across hosts it must be a shared directory, as for TF.
  /// Blocking: other workers keep training meanwhile (asynchronous mode; in synchronous mode the
  /// step waits for the chief's gradient). In asynchronous mode each ps's shards are as they
  /// were when it wrote them (TF's behaviour too); in synchronous mode with every replica
  /// aggregated they are all of the same global step. Returns the manifest's path.
  /// @throws CheckpointError (a ps or the chief could not write, naming it and the system error:
  ///   nothing else is affected and training may go on), InvalidArgument (an empty directory or
  ///   one longer than 4096 bytes, max_to_keep < 1), InvalidUsage (not the chief, before
  ///   initialize() or after finalize()), PeerError/TimeoutError as apply_gradients().
  std::string save_checkpoint(const std::string& dir, int max_to_keep = 5);

  /// Pushes every variable's gradient to its ps and pulls the variables' new values into the
  /// `value` buffers (one message per ps per direction for the small shards, the large shards
  /// straight from and into the caller's buffers). Asynchronous mode: returns once every ps has
  /// applied it (or held it back under max_staleness until the slowest worker caught up).
  /// Synchronous mode: returns once every ps has completed the global step this worker pulled
  /// at (this gradient aggregated, or dropped as stale). Returns the global step after it.
  /// @throws PeerError/TimeoutError naming the ps (or the chief) that failed; InvalidUsage
  ///   before initialize() or after should_stop() became true because the chief ended the job.
  std::int64_t apply_gradients();
  /// Pulls every variable's current values into the `value` buffers. Returns the global step.
  std::int64_t pull();
  /// The global step as of the last reply (ps 0's count of applied updates).
  std::int64_t global_step() const noexcept;
  /// True once the chief ended the job (finalize() on the chief): a worker stops training.
  bool should_stop() const noexcept;

  /// ps tasks: serves the workers until the chief ends the job and every other worker said
  /// goodbye or was lost (TF: server.join()). Logs each lost worker at warn. Returns the ps's
  /// stats. @throws PeerError naming the chief when it died; TimeoutError when no worker sent
  /// anything for the timeout while a request was pending; InvalidUsage on a worker.
  ParameterServerStats join();

  /// Worker tasks: goodbye to every ps. On the chief it also ends the job: every ps then tells
  /// the workers still training to stop (should_stop()), and exits once all of them said
  /// goodbye. Idempotent. @throws PeerError/TimeoutError as apply_gradients().
  void finalize();

  /// This task's counters (worker: its pushes; ps: what it served).
  ParameterServerStats stats() const;

  /// Where variable `index`'s value lives on this worker (as given to create_variable).
  float* value(int index) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// The newest checkpoint of `checkpoint_dir` that ParameterServerStrategy::save_checkpoint()
/// wrote: the path of its manifest (`<dir>/model.ckpt-<step>.manifest`, the largest step; not
/// verified), empty when the directory holds none or does not exist (TF:
/// tf.train.latest_checkpoint). @throws CheckpointError when the directory exists but cannot be
/// read.
MWMS_API std::string latest_checkpoint(const std::string& checkpoint_dir);

/// The SessionCreator of a parameter-server job (mwms/session.h): owns this task's
/// ParameterServerStrategy, connects it lazily (create_session() on workers, join() on ps tasks),
/// declares the caller's variables through `declare_variables` and initialises or restores them,
/// and after a failure connects the whole job again (Note [session recovery] in
/// src/strategy/session.cc). TF: ChiefSessionCreator / WorkerSessionCreator with the
/// replica_device_setter's variables on the ps. Thread safety: one thread at a time.
class MWMS_API ParameterServerSessionCreator : public SessionCreator {
 public:
  /// Declares the variables on a freshly connected strategy (create_variable, every worker the
  /// same in the same order, with buffers that stay valid across recoveries).
  using DeclareVariables = std::function<void(ParameterServerStrategy& strategy)>;
  /// Connects nothing yet. `max_to_keep`: checkpoints kept by save().
  /// @throws InvalidArgument (no declare_variables on a worker, max_to_keep < 1).
  ParameterServerSessionCreator(ResolvedCluster cluster, ParameterServerOptions options,
                                DeclareVariables declare_variables, int max_to_keep = 5);
  ~ParameterServerSessionCreator() override;

  /// This task is a ps: call join(), not a session.
  bool is_ps() const noexcept;
  /// ps tasks: connects and serves until the chief ends the job (TF: server.join()). When the
  /// job fails from elsewhere (the chief lost; a worker recovering abandons its links; every
  /// worker lost) and recoveries are left, connects again and serves the recovered job (the
  /// chief restores the variables): the ps half of Note [session recovery]. Returns the last
  /// serving's stats, with lost_workers of every serving. @throws as
  /// ParameterServerStrategy::join once max_recoveries are spent.
  ParameterServerStats join(int max_recoveries = 0);
  /// The strategy of the current session. @throws InvalidUsage before create_session().
  ParameterServerStrategy& strategy();

  std::int64_t create_session(const std::string& checkpoint_dir) override;
  std::string save(const std::string& checkpoint_dir) override;
  std::int64_t global_step() const override;
  bool is_chief() const override;
  bool job_ended() const override;
  void close() override;
  void abandon() noexcept override;

 private:
  ResolvedCluster cluster_;
  ParameterServerOptions options_;
  DeclareVariables declare_;
  int max_to_keep_;
  std::unique_ptr<ParameterServerStrategy> strategy_;
  std::int64_t last_step_ = 0;
};

}  // namespace mwms
