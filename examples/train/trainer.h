/// @file trainer.h
/// The data-parallel training loop of the `train` program, written against the public
/// MultiWorkerMirroredStrategy API only.
///
/// Note [equivalence]: every worker computes the same global shuffle from (seed, epoch), takes its
/// rows of each global batch with strategy.batch_shard(B), and computes
/// sum over its rows of d loss_i / d params, divided by the GLOBAL batch size B (TF's
/// compute_average_loss). all_reduce_gradients(kSum) then yields exactly the gradient of the mean
/// loss over the global batch, and every worker applies the same SGD-momentum update to the same
/// weights, so N workers follow one worker's trajectory (up to float summation order).
///
/// Note [replica models]: with K local replicas (strategy.num_local_replicas()), every step is one
/// strategy.run(): each replica gathers its own rows (ReplicaContext::batch_shard) into its own
/// buffers, runs forward/backward on its OWN model copy, all-reduces its own gradient with
/// ReplicaContext::all_reduce (a sum over workers x K), and applies the same update with its own
/// optimizer, so the K copies stay identical, as TF's MirroredStrategy keeps one variable copy per
/// device. K = 1 is the same code on the calling thread, reducing in place. The shuffle (order_)
/// is shared and only read inside run().
///
/// Note [gpu replica]: with --device gpu the one local replica also holds a GpuModel
/// (gpu_model.h) built from its CPU model, which stays the host copy of the weights: the leader
/// restores a checkpoint into it and the strategy broadcasts it as on the CPU, then it is copied
/// to the device. A step gathers the same rows into the same host buffers, runs forward/backward
/// on the device, all-reduces the device gradient (one flat buffer: one bucket) with
/// DeviceCommunicator::all_reduce(kSum) on the model's stream and applies SGD-momentum there;
/// the weights come back to the host only for a checkpoint. The strategy still carries every
/// host-side collective (the broadcast, the loss and accuracy sums, the epoch time).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "mwms/device_communicator.h"
#include "mwms/strategy.h"

#include "gpu_model.h"
#include "idx_reader.h"
#include "metrics.h"
#include "mlp.h"
#include "model.h"

namespace mwms::train {

struct TrainConfig {
  int epochs = 3;
  int global_batch_size = 64;
  double learning_rate = 0.01;
  float momentum = 0.9f;
  std::uint64_t seed = 42;
  std::string checkpoint_dir;     ///< empty: no checkpoints
  bool resume = false;
  int max_steps_per_epoch = 0;    ///< 0: every full global batch of the training set
  int eval_chunk = 1000;          ///< test examples per forward pass during evaluation
  /// Overlap the gradient all-reduce with backprop (begin/gradient_ready/finish_gradient_sync):
  /// dense_1's kernel gradient in this many blocks (0: blocking all_reduce_gradients after
  /// backprop).
  int overlap_blocks = 0;
  std::string model = "mlp";      ///< "mlp" (mlp.h) or "cnn" (cnn.h)
  std::string device = "cpu";     ///< "cpu" or "gpu" (Note [gpu replica]); never "auto" here
};

/// The model named by `name` ("mlp" or "cnn") for images of `image_size` pixels and 10 classes.
/// @throws std::runtime_error for another name, or a CNN on images that are not square.
std::unique_ptr<Model> make_model(const std::string& name, std::size_t image_size);

class Trainer {
 public:
  /// Keeps references to `strategy`, `train`, `test` and `device_comm`: they must outlive the
  /// trainer. With config.device "gpu" (Note [gpu replica]), `device_comm` all-reduces the device
  /// gradients and picks the device (DeviceCommunicator::device()). @throws std::runtime_error
  /// for a bad batch size, a GPU run without `device_comm`, with more than one local replica or
  /// with overlap; InvalidUsage or BackendError from make_gpu_model().
  Trainer(const TrainConfig& config, MultiWorkerMirroredStrategy& strategy, const Dataset& train,
          const Dataset& test, DeviceCommunicator* device_comm = nullptr);

  /// Collective. Initialises the weights from the seed, or (with --resume and a checkpoint) the
  /// leader restores them; then the leader's parameters and momentum buffers are broadcast to
  /// every worker. Returns the number of epochs already completed (0 for a fresh run).
  /// The leader uses the newest checkpoint, or the previous one with a warning on stderr when the
  /// newest is missing or unusable (load_checkpoint). @throws the leader's CheckpointError on the
  /// leader and std::runtime_error on every other worker when no checkpoint is usable.
  int prepare();

  /// Collective. Trains epoch `epoch` (0-based); losses are reduced across workers. The same as
  /// begin_epoch(epoch), steps_per_epoch() train_step()s, end_epoch().
  EpochStats train_epoch(int epoch);
  /// Collective. Starts epoch `epoch` (0-based): its shuffle and statistics.
  void begin_epoch(int epoch);
  /// Collective. The epoch's next global step: every replica's rows, forward/backward, the
  /// gradient all-reduce and the update. Returns this worker's mean loss over its rows.
  /// @throws std::logic_error past the epoch's last step, and as the strategy.
  double train_step();
  /// Steps taken in the current epoch.
  int epoch_steps() const { return step_; }
  /// Collective. The current epoch's statistics (losses reduced across workers).
  EpochStats end_epoch();

  /// Called after every step of train_epoch with (step done, steps, this worker's mean loss so
  /// far, seconds since the epoch started); for a progress display (it throttles itself).
  using Progress = std::function<void(int, int, double, double)>;
  void set_progress(Progress progress) { progress_ = std::move(progress); }

  /// Collective. Accuracy on the whole test set: each worker evaluates its shard of it and the
  /// correct counts are summed across workers.
  double evaluate();

  /// Leader only: writes the checkpoint after `epochs_completed` epochs, keeping the previous one
  /// (save_checkpoint); a warning from it goes to stderr. @throws CheckpointError.
  void save(int epochs_completed);

  /// Global batches per epoch (the last partial batch is dropped).
  int steps_per_epoch() const;

 private:
  /// One local replica's model copy, optimizer and buffers (Note [replica models]).
  struct Replica {
    std::unique_ptr<Model> model;         // with a GPU: the host copy (Note [gpu replica])
    std::unique_ptr<GpuModel> gpu;        // --device gpu only
    std::unique_ptr<SgdMomentum> optimizer;
    Shard shard;                          // this replica's rows of every global batch
    std::vector<TensorRef> grad_tensors;  // the flat gradient, whole or per layer
    std::vector<TensorRef> sync_tensors;  // overlap: the gradient in backprop order
    FloatBuffer batch_x;                  // its rows, gathered and scaled
    std::vector<std::uint8_t> batch_y;
    double loss_sum = 0;                  // this epoch's summed loss
    std::size_t correct = 0;              // evaluation
  };

  int restore_on_leader();
  void add_replica();
  void replica_step(const ReplicaContext& ctx);

  TrainConfig config_;
  MultiWorkerMirroredStrategy& strategy_;
  const Dataset& train_;
  const Dataset& test_;
  DeviceCommunicator* device_comm_;     // --device gpu only
  double device_allreduce_seconds_ = 0; // time in device all-reduces (Work::wait included)
  std::vector<Replica> replicas_;       // one per local replica; [0] is saved and restored
  Progress progress_;
  std::vector<std::uint32_t> order_;    // the epoch's global shuffle
  // The current epoch (begin_epoch .. end_epoch).
  int epoch_ = 0;
  int step_ = 0;
  double epoch_start_ = 0;
  double allreduce_before_ = 0;
  double exposed_before_ = 0;
  double device_before_ = 0;
  std::function<void(const ReplicaContext&)> replica_step_fn_;  // built once: no allocation per step
};

}  // namespace mwms::train
