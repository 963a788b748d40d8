#include "trainer.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <functional>
#include <iostream>
#include <stdexcept>

#include "checkpoint.h"
#include "input.h"

namespace mwms::train {
namespace {

double now_seconds() {
  using Clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

// Outcome of the leader's checkpoint load, agreed on by every worker with one reduce(kMax).
constexpr double kNoCheckpoint = 0;
constexpr double kRestored = 1;
constexpr double kRestoreFailed = 2;

}  // namespace

Trainer::Trainer(const TrainConfig& config, MultiWorkerMirroredStrategy& strategy,
                 const Dataset& train, const Dataset& test)
    : config_(config),
      strategy_(strategy),
      train_(train),
      test_(test),
      model_(MlpShape{static_cast<int>(train.images.image_size()), 256, 10}),
      optimizer_(model_.params().size(), static_cast<float>(config.learning_rate), config.momentum) {
  if (config.global_batch_size < 1 ||
      static_cast<std::size_t>(config.global_batch_size) > train.size()) {
    throw std::runtime_error("--batch_size must be between 1 and the training set size (" +
                             std::to_string(train.size()) + "), got " +
                             std::to_string(config.global_batch_size));
  }
  if (test.images.image_size() != train.images.image_size()) {
    throw std::runtime_error("training and test images differ in size");
  }
  shard_ = strategy_.batch_shard(static_cast<std::size_t>(config.global_batch_size));
  const std::size_t features = train.images.image_size();
  // Everything a step touches is allocated here, once: a step allocates nothing.
  batch_x_.resize(std::max<std::size_t>(shard_.size(), config.eval_chunk) * features);
  batch_y_.resize(std::max<std::size_t>(shard_.size(), config.eval_chunk));
  model_.reserve(static_cast<int>(std::max<std::size_t>(shard_.size(), config.eval_chunk)));
  order_.reserve(train.size());
  // Note [flat parameters]: the tensors are adjacent, so a bucket that would hold all of them is
  // the gradient vector itself. Handing it over as one tensor lets the strategy reduce it in
  // place instead of copying everything into a pack buffer and back on every step; only a
  // bytes_per_pack smaller than the whole gradient needs the per-layer tensors.
  float* grads = model_.gradients().data();
  const std::size_t pack = strategy_.options().bytes_per_pack;
  if (config.overlap_blocks > 0) {
    for (const TensorSlot& slot : model_.backprop_order(config.overlap_blocks)) {
      sync_tensors_.push_back(TensorRef{grads + slot.offset, slot.count, DataType::kFloat32});
    }
  }
  if (pack == 0 || pack >= model_.gradients().size() * sizeof(float)) {
    grad_tensors_.push_back(TensorRef{grads, model_.gradients().size(), DataType::kFloat32});
  } else {
    for (const TensorSlot& slot : model_.slots()) {
      grad_tensors_.push_back(TensorRef{grads + slot.offset, slot.count, DataType::kFloat32});
    }
  }
}

int Trainer::steps_per_epoch() const {
  int steps = static_cast<int>(train_.size() / static_cast<std::size_t>(config_.global_batch_size));
  if (config_.max_steps_per_epoch > 0) steps = std::min(steps, config_.max_steps_per_epoch);
  return steps;
}

int Trainer::restore_on_leader() {
  const auto loaded = load_checkpoint(config_.checkpoint_dir, model_.params().size());
  if (!loaded) {
    std::cout << "train: no checkpoint in " << config_.checkpoint_dir
              << ", starting from scratch" << std::endl;
    return -1;
  }
  const Checkpoint& ckpt = loaded->checkpoint;
  if (!loaded->warning.empty()) std::cerr << "train: warning: " << loaded->warning << std::endl;
  if (ckpt.seed != config_.seed) {
    // The shuffle of every epoch derives from the seed: continuing with another one would not
    // reproduce the interrupted run.
    throw CheckpointMismatchError(loaded->path, "seed",
                                  "was written with --seed " + std::to_string(ckpt.seed) +
                                      ", this run has --seed " + std::to_string(config_.seed));
  }
  model_.params().assign(ckpt.params.begin(), ckpt.params.end());
  optimizer_.velocity().assign(ckpt.velocity.begin(), ckpt.velocity.end());
  std::cout << "train: resumed from " << loaded->path
            << (loaded->warning.empty() ? "" : " (the previous checkpoint)") << " after "
            << ckpt.epochs_completed << " epoch(s)" << std::endl;
  // load_checkpoint bounds the count (kMaxCheckpointEpochs), so it fits an int.
  return static_cast<int>(ckpt.epochs_completed);
}

int Trainer::prepare() {
  model_.init(config_.seed);
  std::fill(optimizer_.velocity().begin(), optimizer_.velocity().end(), 0.0f);
  double start_epoch = 0;
  if (config_.resume) {
    // Only the leader reads the checkpoint (workers need not share its file system); its outcome
    // is then agreed on by every worker, so a bad file fails everyone at once instead of leaving
    // the others blocked in the broadcast below until their timeout.
    double status = kNoCheckpoint;
    std::exception_ptr error;
    if (strategy_.is_chief()) {
      try {
        const int restored = restore_on_leader();
        if (restored >= 0) {
          status = kRestored;
          start_epoch = restored;
        }
      } catch (const std::exception&) {
        status = kRestoreFailed;
        error = std::current_exception();
      }
    }
    status = strategy_.reduce(ReduceOp::kMax, status);
    if (status == kRestoreFailed) {
      if (error) std::rethrow_exception(error);  // the leader: its CheckpointError as it was
      throw std::runtime_error("the leader could not restore its checkpoint from " +
                               config_.checkpoint_dir + " (see the leader's error)");
    }
    start_epoch = strategy_.reduce(ReduceOp::kMax, start_epoch);
  }
  // Same seed gives the same weights everywhere already; the broadcast makes it certain and is
  // what carries a restored checkpoint (parameters and momentum) to the other workers.
  strategy_.broadcast_variables(
      {TensorRef{model_.params().data(), model_.params().size(), DataType::kFloat32},
       TensorRef{optimizer_.velocity().data(), optimizer_.velocity().size(),
                 DataType::kFloat32}});
  return static_cast<int>(start_epoch);
}

EpochStats Trainer::train_epoch(int epoch) {
  epoch_order(config_.seed, epoch, train_.size(), order_);
  const int steps = steps_per_epoch();
  const std::size_t global_batch = static_cast<std::size_t>(config_.global_batch_size);
  const int local = static_cast<int>(shard_.size());
  const float scale = 1.0f / static_cast<float>(global_batch);  // Note [equivalence]
  double loss_sum = 0;
  const double allreduce_before = strategy_.allreduce_seconds();
  const double exposed_before = strategy_.exposed_allreduce_seconds();
  const double start = now_seconds();
  const std::function<void(std::size_t)> ready = [this](std::size_t i) {
    strategy_.gradient_ready(i);
  };
  for (int step = 0; step < steps; ++step) {
    const std::uint32_t* rows = order_.data() + step * global_batch + shard_.begin;
    gather_batch(train_, rows, shard_.size(), batch_x_.data(), batch_y_.data());
    if (config_.overlap_blocks > 0) {
      // Buckets are all-reduced while the rest of backprop runs (Note [backprop order]).
      strategy_.begin_gradient_sync(sync_tensors_, ReduceOp::kSum);
      loss_sum += model_.forward_backward(batch_x_.data(), batch_y_.data(), local, scale, ready,
                                          config_.overlap_blocks);
      strategy_.finish_gradient_sync();
    } else {
      loss_sum += model_.forward_backward(batch_x_.data(), batch_y_.data(), local, scale);
      strategy_.all_reduce_gradients(grad_tensors_, ReduceOp::kSum);
    }
    optimizer_.step(model_.params(), model_.gradients());
    if (progress_) {
      progress_(step + 1, steps, loss_sum / (static_cast<double>(step + 1) * std::max(local, 1)),
                now_seconds() - start);
    }
  }
  EpochStats stats;
  stats.epoch = epoch + 1;
  stats.steps = steps;
  stats.allreduce_seconds = strategy_.allreduce_seconds() - allreduce_before;
  stats.exposed_allreduce_seconds = strategy_.exposed_allreduce_seconds() - exposed_before;
  // The slowest worker sets the pace of a synchronous step.
  stats.seconds = strategy_.reduce(ReduceOp::kMax, now_seconds() - start);
  const double examples = static_cast<double>(steps) * static_cast<double>(global_batch);
  stats.train_loss = steps > 0 ? strategy_.reduce(ReduceOp::kSum, loss_sum) / examples : 0.0;
  stats.images_per_sec = stats.seconds > 0 ? examples / stats.seconds : 0.0;
  stats.allreduce_share = stats.seconds > 0 ? stats.allreduce_seconds / stats.seconds : 0.0;
  return stats;
}

double Trainer::evaluate() {
  const Shard shard = strategy_.batch_shard(test_.size());
  const std::size_t chunk = static_cast<std::size_t>(config_.eval_chunk);
  std::size_t correct = 0;
  for (std::size_t begin = shard.begin; begin < shard.end; begin += chunk) {
    const std::size_t count = std::min(chunk, shard.end - begin);
    gather_range(test_, begin, count, batch_x_.data(), batch_y_.data());
    correct += model_.count_correct(batch_x_.data(), batch_y_.data(), static_cast<int>(count));
  }
  const double total = strategy_.reduce(ReduceOp::kSum, static_cast<double>(correct));
  return total / static_cast<double>(test_.size());
}

void Trainer::save(int epochs_completed) {
  Checkpoint ckpt;
  ckpt.epochs_completed = epochs_completed;
  ckpt.steps_per_epoch = static_cast<std::uint64_t>(steps_per_epoch());
  ckpt.seed = config_.seed;
  ckpt.global_batch_size = static_cast<std::uint64_t>(config_.global_batch_size);
  ckpt.params.assign(model_.params().begin(), model_.params().end());
  ckpt.velocity.assign(optimizer_.velocity().begin(), optimizer_.velocity().end());
  const std::string warning = save_checkpoint(config_.checkpoint_dir, ckpt);
  if (!warning.empty()) std::cerr << "train: warning: " << warning << std::endl;
}

}  // namespace mwms::train
