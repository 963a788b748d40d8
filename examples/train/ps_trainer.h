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

class PsTrainer {
 public:
  /// Declares the model's tensors as variables of `strategy` (a worker's). Keeps references:
  /// everything must outlive the trainer. @throws std::runtime_error for a bad batch size.
  PsTrainer(const TrainConfig& config, ParameterServerStrategy& strategy, const Dataset& train,
            const Dataset& test);
  /// Collective over the job: the chief initialises the weights from the seed and they become
  /// the variables; every worker pulls them.
  void prepare();
  /// Trains epoch `epoch` (0-based): steps_per_epoch() steps on this worker's shard of each
  /// global batch (batch_shard), or fewer when the chief ends the job. seconds/images_per_sec
  /// are this worker's; train_loss its own mean.
  EpochStats train_epoch(int epoch);
  /// Pulls the current variables and evaluates the whole test set on them.
  double evaluate();
  int steps_per_epoch() const;
  PsSummary summary() const;

 private:
  TrainConfig config_;
  ParameterServerStrategy& strategy_;
  const Dataset& train_;
  const Dataset& test_;
  std::unique_ptr<Model> model_;
  Shard shard_;
  FloatBuffer batch_x_;
  std::vector<std::uint8_t> batch_y_;
  std::vector<std::uint32_t> order_;
};

}  // namespace mwms::train
