/// @file metrics.h
/// Per-epoch statistics of a run and the JSON metrics file the leader writes (--metrics_file).
#pragma once

#include <string>
#include <vector>

namespace mwms::train {

/// One epoch as every worker agrees on it (losses and accuracy are reduced across workers).
struct EpochStats {
  int epoch = 0;                  ///< 1-based
  int steps = 0;                  ///< global batches trained
  double train_loss = 0;          ///< mean per-example loss over the epoch's training examples
  double test_accuracy = 0;       ///< on the whole test set, after the epoch
  double seconds = 0;             ///< training time of the epoch (evaluation excluded)
  double images_per_sec = 0;      ///< global images trained per second
  double allreduce_seconds = 0;   ///< this worker's time inside all_reduce_gradients
  double allreduce_share = 0;     ///< allreduce_seconds / seconds
  double exposed_allreduce_seconds = 0;  ///< of it, time waiting that compute did not hide
};

/// What the metrics file reports about the whole run.
struct RunSummary {
  int epochs = 0;                 ///< epochs completed (including ones restored from a checkpoint)
  int num_replicas_in_sync = 1;
  int world_size = 1;
  int local_replicas = 1;         ///< per worker (num_replicas_in_sync = world_size x this)
  std::string model = "mlp";      ///< --model
  std::string device = "cpu";     ///< where the replicas ran
  std::string source;             ///< where the cluster came from: tf_config, mpi, flags, default
  std::string task;               ///< the leader's task name
  int global_batch_size = 0;
  double learning_rate = 0;
  unsigned long long seed = 0;
  double test_accuracy = 0;
  double final_train_loss = 0;    ///< NaN-free: 0 when no epoch ran in this process
  double allreduce_seconds = 0;   ///< total over this run's epochs
  double exposed_allreduce_seconds = 0;  ///< total over this run's epochs
  std::vector<EpochStats> per_epoch;  ///< the epochs trained by this run
  /// "all-reduce", or the parameter-server modes "ps-sync" / "ps-async" (docs/parameter_server.md);
  /// the fields below are written for the ps modes only.
  std::string mode = "all-reduce";
  int num_ps = 0;
  long long global_step = 0;       ///< updates the ps applied (ps 0's count)
  long long pushes = 0;            ///< gradients this task pushed (worker) or received (ps)
  long long dropped_stale = 0;     ///< gradients dropped as stale (sync)
  /// A ps task's summary (train --job_name=ps): what it served, without the training fields
  /// (accuracy, loss, images/s, epochs, all-reduce times), which a ps does not measure.
  bool ps_task = false;
  long long applied = 0;    ///< ps metrics: gradients applied (async) or aggregated (sync)
  long long after_end = 0;  ///< ps metrics: gradients received after the chief ended the job
  std::vector<unsigned long long> bytes_pushed;  ///< gradient bytes, by ps
  std::vector<unsigned long long> bytes_pulled;  ///< variable bytes, by ps
  /// ps metrics: applied gradients by staleness (last bucket: that many or more).
  std::vector<long long> staleness_histogram;
  std::vector<std::string> lost_workers;  ///< ps metrics: workers it lost
  int recoveries = 0;  ///< times the session reconnected and restored (ps modes)
};

/// Mean images/s over the epochs of `summary` (0 when none).
double mean_images_per_sec(const RunSummary& summary);

/// Writes `summary` as JSON to `path` atomically (temporary file next to it, then rename), so a
/// reader never sees a half-written file. @throws std::runtime_error naming the file.
void write_metrics(const std::string& path, const RunSummary& summary);

}  // namespace mwms::train
