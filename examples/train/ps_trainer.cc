#include "ps_trainer.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>

namespace mwms::train {
namespace {

double now_seconds() {
  using Clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

}  // namespace

PsTrainer::PsTrainer(const TrainConfig& config, ParameterServerStrategy& strategy,
                     const Dataset& train, const Dataset& test)
    : config_(config), strategy_(strategy), train_(train), test_(test) {
  if (config.global_batch_size < strategy.num_workers() ||
      static_cast<std::size_t>(config.global_batch_size) > train.size()) {
    throw std::runtime_error("--batch_size must be between the number of workers (" +
                             std::to_string(strategy.num_workers()) +
                             ") and the training set size (" + std::to_string(train.size()) +
                             "), got " + std::to_string(config.global_batch_size));
  }
  model_ = make_model(config.model, train.images.image_size());
  ReplicaContext ctx;
  ctx.replica_id_in_sync_group = strategy.worker_index();
  ctx.num_replicas_in_sync = strategy.num_workers();
  shard_ = ctx.batch_shard(static_cast<std::size_t>(config.global_batch_size));
  const std::size_t features = train.images.image_size();
  const std::size_t rows = std::max<std::size_t>(shard_.size(), config.eval_chunk);
  batch_x_.resize(rows * features);
  batch_y_.resize(rows);
  model_->reserve(static_cast<int>(rows));
  order_.reserve(train.size());
  // Each tensor of the flat parameter vector is one variable; a dense kernel gets its 2-D shape
  // (fan_in rows of fan_out: the partitioners split rows), everything else is 1-D.
  const std::vector<GlorotFans> fans = model_->glorot_fans();
  const std::vector<TensorSlot>& slots = model_->slots();
  for (std::size_t i = 0; i < slots.size(); ++i) {
    VariableSpec spec;
    spec.name = slots[i].name;
    spec.shape = {static_cast<std::int64_t>(slots[i].count)};
    for (const GlorotFans& f : fans) {
      if (f.slot == i && static_cast<std::size_t>(f.fan_in) * f.fan_out == slots[i].count) {
        spec.shape = {f.fan_in, f.fan_out};
      }
    }
    strategy.create_variable(spec, model_->params().data() + slots[i].offset,
                             model_->gradients().data() + slots[i].offset);
  }
}

int PsTrainer::steps_per_epoch() const {
  int steps = static_cast<int>(train_.size() / static_cast<std::size_t>(config_.global_batch_size));
  if (config_.max_steps_per_epoch > 0) steps = std::min(steps, config_.max_steps_per_epoch);
  return steps;
}

void PsTrainer::prepare() {
  // The chief's values become the variables (initialize() sends them); the others' are
  // overwritten by the pull.
  if (strategy_.is_chief()) model_->init(config_.seed);
  strategy_.initialize();
}

EpochStats PsTrainer::train_epoch(int epoch) {
  epoch_order(config_.seed, epoch, train_.size(), order_);
  const int steps = steps_per_epoch();
  const std::size_t global_batch = static_cast<std::size_t>(config_.global_batch_size);
  const int rows = static_cast<int>(shard_.size());
  // Note [ps gradient scale]: synchronous mode averages the workers' gradients on the ps, so
  // each worker scales its summed gradient by workers / global batch: the mean of the workers'
  // is then the gradient of the mean loss over the global batch, as the all-reduce mode
  // computes it (Note [equivalence] in trainer.h). Asynchronous mode applies each worker's
  // gradient alone: the mean over its own rows.
  const float scale =
      strategy_.options().sync_replicas
          ? static_cast<float>(strategy_.num_workers()) / static_cast<float>(global_batch)
          : 1.0f / static_cast<float>(std::max(rows, 1));
  double loss_sum = 0;
  int done = 0;
  const double start = now_seconds();
  for (int step = 0; step < steps && !strategy_.should_stop(); ++step) {
    const std::uint32_t* indices = order_.data() + step * global_batch + shard_.begin;
    gather_batch(train_, indices, shard_.size(), batch_x_.data(), batch_y_.data());
    loss_sum += model_->forward_backward(batch_x_.data(), batch_y_.data(), rows, scale, {}, 1);
    strategy_.apply_gradients();
    ++done;
  }
  EpochStats stats;
  stats.epoch = epoch + 1;
  stats.steps = done;
  stats.seconds = now_seconds() - start;
  const double examples = static_cast<double>(done) * static_cast<double>(global_batch);
  stats.train_loss = done > 0 ? loss_sum / (static_cast<double>(done) * std::max(rows, 1)) : 0.0;
  stats.images_per_sec = stats.seconds > 0 ? examples / stats.seconds : 0.0;
  return stats;
}

double PsTrainer::evaluate() {
  if (!strategy_.should_stop()) strategy_.pull();
  const std::size_t chunk = static_cast<std::size_t>(config_.eval_chunk);
  std::size_t correct = 0;
  for (std::size_t begin = 0; begin < test_.size(); begin += chunk) {
    const std::size_t count = std::min(chunk, test_.size() - begin);
    gather_range(test_, begin, count, batch_x_.data(), batch_y_.data());
    correct += model_->count_correct(batch_x_.data(), batch_y_.data(), static_cast<int>(count));
  }
  return static_cast<double>(correct) / static_cast<double>(test_.size());
}

PsSummary PsTrainer::summary() const {
  const ParameterServerStats s = strategy_.stats();
  PsSummary p;
  p.mode = strategy_.options().sync_replicas ? "ps-sync" : "ps-async";
  p.num_ps = strategy_.num_ps();
  p.global_step = s.global_step;
  p.pushes = s.pushes;
  p.dropped_stale = s.dropped_stale;
  p.bytes_pushed = s.bytes_pushed;
  p.bytes_pulled = s.bytes_pulled;
  return p;
}

}  // namespace mwms::train
