/// @file ps_trainer.h
/// `train` in parameter-server mode (docs/parameter_server.md): the model's tensors are variables
/// on the ps tasks (mwms::ParameterServerStrategy), each worker computes gradients on its shard of
/// every global batch, pushes them and pulls the new values; the ps tasks run the optimizer.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "idx_reader.h"
#include "input.h"
#include "metrics.h"
#include "model.h"
#include "mwms/parameter_server.h"
#include "trainer.h"

namespace mwms::train {

/// What the ps mode adds to the metrics file.
struct PsSummary {
  std::string mode;  ///< "ps-sync" or "ps-async"
  int num_ps = 0;
  std::int64_t global_step = 0;
  std::int64_t pushes = 0;         ///< this worker's
  std::int64_t dropped_stale = 0;  ///< this worker's gradients dropped as stale (sync)
  std::vector<std::uint64_t> bytes_pushed;  ///< by ps
  std::vector<std::uint64_t> bytes_pulled;  ///< by ps
};

/// Note [ps input position]: where a worker is in the input follows from the global step alone,
/// so a restored or recovered job continues where its checkpoint left it. Synchronous mode:
/// every worker computes its rows of global batch `global_step` (all of them pulled the same
/// version). Asynchronous mode: each worker counts its own steps; the global step counts every
/// worker's pushes, so a worker that starts at global step G is at its step G / num_workers.
/// Step k is batch k % steps_per_epoch of epoch k / steps_per_epoch's shuffle.
class PsTrainer {
 public:
  /// A worker's trainer (task id `worker_index` of `num_workers`). Keeps references to `train`
  /// and `test`. @throws std::runtime_error for a bad batch size.
  PsTrainer(const TrainConfig& config, int num_workers, int worker_index, bool sync_replicas,
            bool is_chief, const Dataset& train, const Dataset& test);
  /// Declares the model's tensors as variables of a freshly connected `strategy` (the session
  /// creator calls it on every (re)connection); on the chief the weights are first initialised
  /// from the seed, and become the variables unless a checkpoint is restored.
  void declare(ParameterServerStrategy& strategy);
  /// Positions the input at `global_step` (Note [ps input position]) and starts an epoch's
  /// statistics.
  void start_at(std::int64_t global_step);
  /// One step: this worker's rows of its current batch, forward/backward, push and pull. Returns
  /// the mean loss over its rows.
  double step(ParameterServerStrategy& strategy);
  /// True when the last step finished an epoch (of this worker's steps).
  bool epoch_done() const;
  /// The statistics of the epoch that just ended (or the partial one), and a new epoch begun.
  /// seconds/images_per_sec are this worker's.
  EpochStats end_epoch();
  /// Steps taken in the current epoch.
  int epoch_steps() const { return epoch_steps_; }
  /// The epoch (0-based) the next step belongs to.
  int epoch() const;
  /// Pulls the current variables and evaluates the whole test set on them.
  double evaluate(ParameterServerStrategy& strategy);
  int steps_per_epoch() const;
  /// The global step at which `epochs` epochs are done (the StopAtStepHook's last_step).
  std::int64_t last_step(int epochs) const;

 private:
  TrainConfig config_;
  int num_workers_;
  bool sync_;
  bool chief_;
  const Dataset& train_;
  const Dataset& test_;
  std::unique_ptr<Model> model_;
  Shard shard_;
  FloatBuffer batch_x_;
  std::vector<std::uint8_t> batch_y_;
  std::vector<std::uint32_t> order_;
  int order_epoch_ = -1;       // the epoch order_ holds
  std::int64_t position_ = 0;  // this worker's next step (Note [ps input position])
  int epoch_steps_ = 0;
  double epoch_loss_ = 0;
  double epoch_start_ = 0;
  bool epoch_done_ = false;
};

/// The ps-mode summary of `strategy` for the metrics file.
PsSummary ps_summary(const ParameterServerStrategy& strategy);

}  // namespace mwms::train
