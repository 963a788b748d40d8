#include "trainer.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <exception>
#include <functional>
#include <iostream>
#include <stdexcept>

#include "checkpoint.h"
#include "cnn.h"
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

std::unique_ptr<Model> make_model(const std::string& name, std::size_t image_size) {
  if (name == "mlp") return std::make_unique<Mlp>(MlpShape{static_cast<int>(image_size), 256, 10});
  if (name == "cnn") {
    const int side = static_cast<int>(std::lround(std::sqrt(static_cast<double>(image_size))));
    if (static_cast<std::size_t>(side) * side != image_size) {
      throw std::runtime_error("--model cnn needs square images; these have " +
                               std::to_string(image_size) + " pixels");
    }
    return std::make_unique<Cnn>(CnnShape{side, 32, 64, 10});
  }
  throw std::runtime_error("unknown --model " + name + " (mlp or cnn)");
}

Trainer::Trainer(const TrainConfig& config, MultiWorkerMirroredStrategy& strategy,
                 const Dataset& train, const Dataset& test, DeviceCommunicator* device_comm)
    : config_(config), strategy_(strategy), train_(train), test_(test), device_comm_(device_comm) {
  if (config.global_batch_size < 1 ||
      static_cast<std::size_t>(config.global_batch_size) > train.size()) {
    throw std::runtime_error("--batch_size must be between 1 and the training set size (" +
                             std::to_string(train.size()) + "), got " +
                             std::to_string(config.global_batch_size));
  }
  if (test.images.image_size() != train.images.image_size()) {
    throw std::runtime_error("training and test images differ in size");
  }
  if (config.device == "gpu") {
    // Note [gpu replica]
    if (device_comm == nullptr) {
      throw std::runtime_error("--device gpu needs a DeviceCommunicator for the gradients");
    }
    if (strategy.num_local_replicas() > 1 || config.overlap_blocks > 0) {
      throw std::runtime_error(
          "--device gpu runs one replica per process (--local_replicas 1, no --overlap_blocks): "
          "launch one process per GPU");
    }
  } else if (config.device != "cpu") {
    throw std::runtime_error("unknown device " + config.device + " (cpu or gpu)");
  }
  // A global batch that the replicas in sync do not divide is split as batch_shard splits it
  // (the first global_batch % n replicas one row more, as tf.data's rebatch does): legal, but
  // the replicas then weigh their rows unequally, so say so once, on the chief.
  const int in_sync = strategy.num_replicas_in_sync();
  if (in_sync > 1 && config.global_batch_size % in_sync != 0 && strategy.is_chief()) {
    const int base = config.global_batch_size / in_sync;
    const int longer = config.global_batch_size % in_sync;
    std::fprintf(stderr,
                 "train: warning: --batch_size %d does not divide by the %d replicas in sync: "
                 "%d replica(s) take %d rows, %d take %d; use a multiple of %d for equal shards\n",
                 config.global_batch_size, in_sync, longer, base + 1, in_sync - longer, base,
                 in_sync);
  }
  replicas_.reserve(static_cast<std::size_t>(strategy.num_local_replicas()));
  for (int r = 0; r < strategy.num_local_replicas(); ++r) add_replica();
  order_.reserve(train.size());
}

void Trainer::add_replica() {
  Replica rep;
  rep.model = make_model(config_.model, train_.images.image_size());
  Model& model = *rep.model;
  rep.optimizer = std::make_unique<SgdMomentum>(
      model.params().size(), static_cast<float>(config_.learning_rate), config_.momentum);
  // Replica r of worker w is replica w * K + r in sync (ReplicaContext::batch_shard).
  const std::size_t in_sync = static_cast<std::size_t>(strategy_.num_replicas_in_sync());
  const std::size_t id = static_cast<std::size_t>(strategy_.worker_index()) *
                             static_cast<std::size_t>(strategy_.num_local_replicas()) +
                         replicas_.size();
  ReplicaContext ctx;
  ctx.replica_id_in_sync_group = static_cast<int>(id);
  ctx.num_replicas_in_sync = static_cast<int>(in_sync);
  rep.shard = ctx.batch_shard(static_cast<std::size_t>(config_.global_batch_size));
  const std::size_t features = train_.images.image_size();
  const std::size_t rows = std::max<std::size_t>(rep.shard.size(), config_.eval_chunk);
  // Everything a step touches is allocated here, once: a step allocates nothing.
  rep.batch_x.resize(rows * features);
  rep.batch_y.resize(rows);
  if (config_.device == "gpu") {
    rep.gpu = make_gpu_model(make_model(config_.model, features), device_comm_->device(),
                             static_cast<int>(rows));
  } else {
    model.reserve(static_cast<int>(rows));
  }
  // Note [flat parameters]: the tensors are adjacent, so a bucket that would hold all of them is
  // the gradient vector itself. Handing it over as one tensor lets the strategy reduce it in
  // place instead of copying everything into a pack buffer and back on every step; only a
  // bytes_per_pack smaller than the whole gradient needs the per-layer tensors.
  float* grads = model.gradients().data();
  const std::size_t pack = *strategy_.options().bytes_per_pack;  // set: options() is resolved
  if (config_.overlap_blocks > 0) {
    for (const TensorSlot& slot : model.backprop_order(config_.overlap_blocks)) {
      rep.sync_tensors.push_back(TensorRef{grads + slot.offset, slot.count, DataType::kFloat32});
    }
  }
  if (pack == 0 || pack >= model.gradients().size() * sizeof(float)) {
    rep.grad_tensors.push_back(TensorRef{grads, model.gradients().size(), DataType::kFloat32});
  } else {
    for (const TensorSlot& slot : model.slots()) {
      rep.grad_tensors.push_back(TensorRef{grads + slot.offset, slot.count, DataType::kFloat32});
    }
  }
  replicas_.push_back(std::move(rep));
}

int Trainer::steps_per_epoch() const {
  int steps = static_cast<int>(train_.size() / static_cast<std::size_t>(config_.global_batch_size));
  if (config_.max_steps_per_epoch > 0) steps = std::min(steps, config_.max_steps_per_epoch);
  return steps;
}

int Trainer::restore_on_leader() {
  Model& model = *replicas_[0].model;
  const auto loaded = load_checkpoint(config_.checkpoint_dir, model.params().size());
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
  model.params().assign(ckpt.params.begin(), ckpt.params.end());
  replicas_[0].optimizer->velocity().assign(ckpt.velocity.begin(), ckpt.velocity.end());
  std::cout << "train: resumed from " << loaded->path
            << (loaded->warning.empty() ? "" : " (the previous checkpoint)") << " after "
            << ckpt.epochs_completed << " epoch(s)" << std::endl;
  // load_checkpoint bounds the count (kMaxCheckpointEpochs), so it fits an int.
  return static_cast<int>(ckpt.epochs_completed);
}

int Trainer::prepare() {
  for (Replica& rep : replicas_) {
    rep.model->init(config_.seed);
    std::fill(rep.optimizer->velocity().begin(), rep.optimizer->velocity().end(), 0.0f);
  }
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
  // what carries a restored checkpoint (parameters and momentum) to the other workers and to
  // every local replica's copy.
  strategy_.run([this](const ReplicaContext& ctx) {
    Replica& rep = replicas_[static_cast<std::size_t>(ctx.local_replica_id)];
    FloatBuffer& params = rep.model->params();
    FloatBuffer& velocity = rep.optimizer->velocity();
    ctx.broadcast_variables({TensorRef{params.data(), params.size(), DataType::kFloat32},
                             TensorRef{velocity.data(), velocity.size(), DataType::kFloat32}});
    if (rep.gpu) rep.gpu->upload(params.data(), velocity.data());  // Note [gpu replica]
  });
  return static_cast<int>(start_epoch);
}

EpochStats Trainer::train_epoch(int epoch) {
  begin_epoch(epoch);
  for (int step = 0; step < steps_per_epoch(); ++step) train_step();
  return end_epoch();
}

void Trainer::begin_epoch(int epoch) {
  epoch_order(config_.seed, epoch, train_.size(), order_);
  epoch_ = epoch;
  step_ = 0;
  for (Replica& rep : replicas_) rep.loss_sum = 0;
  allreduce_before_ = strategy_.all_reduce_seconds();
  exposed_before_ = strategy_.exposed_all_reduce_seconds();
  device_before_ = device_allreduce_seconds_;
  epoch_start_ = now_seconds();
}

// One replica's step (Note [replica models]); K = 1 runs it on this thread.
void Trainer::replica_step(const ReplicaContext& ctx) {
  const std::size_t global_batch = static_cast<std::size_t>(config_.global_batch_size);
  const float scale = 1.0f / static_cast<float>(global_batch);  // Note [equivalence]
  Replica& rep = replicas_[static_cast<std::size_t>(ctx.local_replica_id)];
  const int rows = static_cast<int>(rep.shard.size());
  const std::uint32_t* indices =
      order_.data() + static_cast<std::size_t>(step_) * global_batch + rep.shard.begin;
  gather_batch(train_, indices, rep.shard.size(), rep.batch_x.data(), rep.batch_y.data());
  if (rep.gpu) {
    // Note [gpu replica]: the flat device gradient is one bucket.
    rep.loss_sum += rep.gpu->forward_backward(rep.batch_x.data(), rep.batch_y.data(), rows, scale);
    const double t0 = now_seconds();
    device_comm_
        ->all_reduce_async(rep.gpu->device_gradients(), rep.gpu->size(), DataType::kFloat32,
                           ReduceOp::kSum, DeviceStream{rep.gpu->stream()})
        ->wait();
    device_allreduce_seconds_ += now_seconds() - t0;
    rep.gpu->sgd_step(static_cast<float>(config_.learning_rate), config_.momentum);
    return;
  }
  if (config_.overlap_blocks > 0) {
    // Buckets are all-reduced while the rest of backprop runs (Note [backprop order]); with
    // K > 1 each bucket is first reduced across the local replicas (Note [overlapped replica
    // buckets]). One pointer captured: held inside std::function, no allocation.
    const std::function<void(std::size_t)> ready = [&ctx](std::size_t i) {
      ctx.gradient_ready(i);
    };
    ctx.begin_gradient_sync(rep.sync_tensors, ReduceOp::kSum);
    rep.loss_sum += rep.model->forward_backward(rep.batch_x.data(), rep.batch_y.data(), rows,
                                                scale, ready, config_.overlap_blocks);
    ctx.finish_gradient_sync();
  } else {
    rep.loss_sum +=
        rep.model->forward_backward(rep.batch_x.data(), rep.batch_y.data(), rows, scale, {}, 1);
    ctx.all_reduce(ReduceOp::kSum, rep.grad_tensors);
  }
  rep.optimizer->step(rep.model->params(), rep.model->gradients());
}

double Trainer::train_step() {
  const int steps = steps_per_epoch();
  if (step_ >= steps) throw std::logic_error("train_step past the end of the epoch");
  std::size_t local_rows = 0;
  double before = 0;
  for (const Replica& rep : replicas_) {
    local_rows += rep.shard.size();
    before += rep.loss_sum;
  }
  if (!replica_step_fn_) {
    replica_step_fn_ = [this](const ReplicaContext& ctx) { replica_step(ctx); };
  }
  strategy_.run(replica_step_fn_);
  ++step_;
  double loss_sum = 0;
  for (const Replica& rep : replicas_) loss_sum += rep.loss_sum;
  const double rows = static_cast<double>(std::max<std::size_t>(local_rows, 1));
  if (progress_) {
    progress_(step_, steps, loss_sum / (static_cast<double>(step_) * rows),
              now_seconds() - epoch_start_);
  }
  return (loss_sum - before) / rows;
}

EpochStats Trainer::end_epoch() {
  const std::size_t global_batch = static_cast<std::size_t>(config_.global_batch_size);
  const int steps = step_;
  double loss_sum = 0;
  for (const Replica& rep : replicas_) loss_sum += rep.loss_sum;
  EpochStats stats;
  stats.epoch = epoch_ + 1;
  stats.steps = steps;
  const double device_seconds = device_allreduce_seconds_ - device_before_;
  stats.allreduce_seconds = strategy_.all_reduce_seconds() - allreduce_before_ + device_seconds;
  stats.exposed_allreduce_seconds =
      strategy_.exposed_all_reduce_seconds() - exposed_before_ + device_seconds;
  // The slowest worker sets the pace of a synchronous step.
  stats.seconds = strategy_.reduce(ReduceOp::kMax, now_seconds() - epoch_start_);
  const double examples = static_cast<double>(steps) * static_cast<double>(global_batch);
  stats.train_loss = steps > 0 ? strategy_.reduce(ReduceOp::kSum, loss_sum) / examples : 0.0;
  stats.images_per_sec = stats.seconds > 0 ? examples / stats.seconds : 0.0;
  stats.allreduce_share = stats.seconds > 0 ? stats.allreduce_seconds / stats.seconds : 0.0;
  return stats;
}

double Trainer::evaluate() {
  const std::size_t chunk = static_cast<std::size_t>(config_.eval_chunk);
  // Every replica holds the same weights: each evaluates its part of the test set.
  strategy_.run([&](const ReplicaContext& ctx) {
    Replica& rep = replicas_[static_cast<std::size_t>(ctx.local_replica_id)];
    const Shard shard = ctx.batch_shard(test_.size());
    rep.correct = 0;
    for (std::size_t begin = shard.begin; begin < shard.end; begin += chunk) {
      const std::size_t count = std::min(chunk, shard.end - begin);
      gather_range(test_, begin, count, rep.batch_x.data(), rep.batch_y.data());
      const int rows = static_cast<int>(count);
      rep.correct += rep.gpu ? rep.gpu->count_correct(rep.batch_x.data(), rep.batch_y.data(), rows)
                             : rep.model->count_correct(rep.batch_x.data(), rep.batch_y.data(), rows);
    }
  });
  std::size_t correct = 0;
  for (const Replica& rep : replicas_) correct += rep.correct;
  const double total = strategy_.reduce(ReduceOp::kSum, static_cast<double>(correct));
  return total / static_cast<double>(test_.size());
}

void Trainer::save(int epochs_completed) {
  Checkpoint ckpt;
  ckpt.epochs_completed = epochs_completed;
  ckpt.steps_per_epoch = static_cast<std::uint64_t>(steps_per_epoch());
  ckpt.seed = config_.seed;
  ckpt.global_batch_size = static_cast<std::uint64_t>(config_.global_batch_size);
  Replica& rep = replicas_[0];
  if (rep.gpu) rep.gpu->download(rep.model->params().data(), rep.optimizer->velocity().data());
  ckpt.params.assign(rep.model->params().begin(), rep.model->params().end());
  ckpt.velocity.assign(rep.optimizer->velocity().begin(), rep.optimizer->velocity().end());
  const std::string warning = save_checkpoint(config_.checkpoint_dir, ckpt);
  if (!warning.empty()) std::cerr << "train: warning: " << warning << std::endl;
}

}  // namespace mwms::train
