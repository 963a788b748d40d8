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

PsTrainer::PsTrainer(const TrainConfig& config, int num_workers, int worker_index,
                     bool sync_replicas, bool is_chief, const Dataset& train, const Dataset& test)
    : config_(config),
      num_workers_(num_workers),
      sync_(sync_replicas),
      chief_(is_chief),
      train_(train),
      test_(test) {
  if (config.global_batch_size < num_workers ||
      static_cast<std::size_t>(config.global_batch_size) > train.size()) {
    throw std::runtime_error("--batch_size must be between the number of workers (" +
                             std::to_string(num_workers) + ") and the training set size (" +
                             std::to_string(train.size()) + "), got " +
                             std::to_string(config.global_batch_size));
  }
  model_ = make_model(config.model, train.images.image_size());
  ReplicaContext ctx;
  ctx.replica_id_in_sync_group = worker_index;
  ctx.num_replicas_in_sync = num_workers;
  shard_ = ctx.batch_shard(static_cast<std::size_t>(config.global_batch_size));
  const std::size_t features = train.images.image_size();
  const std::size_t rows = std::max<std::size_t>(shard_.size(), config.eval_chunk);
  batch_x_.resize(rows * features);
  batch_y_.resize(rows);
  model_->reserve(static_cast<int>(rows));
  order_.reserve(train.size());
}

void PsTrainer::declare(ParameterServerStrategy& strategy) {
  // The chief's values become the variables (initialize() sends them); the others' are
  // overwritten by the pull, and everyone's by a restored checkpoint.
  if (chief_) model_->init(config_.seed);
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

std::int64_t PsTrainer::last_step(int epochs) const {
  // Asynchronous: every worker's push is a global step (Note [ps input position]).
  return static_cast<std::int64_t>(epochs) * steps_per_epoch() * (sync_ ? 1 : num_workers_);
}

void PsTrainer::start_at(std::int64_t global_step) {
  position_ = sync_ ? global_step : global_step / num_workers_;
  epoch_steps_ = 0;
  epoch_loss_ = 0;
  epoch_done_ = false;
  epoch_start_ = now_seconds();
}

int PsTrainer::epoch() const {
  const int spe = std::max(steps_per_epoch(), 1);
  return static_cast<int>(position_ / spe);
}

bool PsTrainer::epoch_done() const { return epoch_done_; }

double PsTrainer::step(ParameterServerStrategy& strategy) {
  const int spe = std::max(steps_per_epoch(), 1);
  // Synchronous: the batch of the version pulled, so a worker whose last gradient was dropped
  // joins the others' step.
  if (sync_) position_ = strategy.global_step();
  const int epoch = static_cast<int>(position_ / spe);
  const std::int64_t batch = position_ % spe;
  if (epoch != order_epoch_) {
    epoch_order(config_.seed, epoch, train_.size(), order_);
    order_epoch_ = epoch;
  }
  const std::size_t global_batch = static_cast<std::size_t>(config_.global_batch_size);
  const int rows = static_cast<int>(shard_.size());
  // Note [ps gradient scale]: synchronous mode averages the workers' gradients on the ps, so
  // each worker scales its summed gradient by workers / global batch: the mean of the workers'
  // is then the gradient of the mean loss over the global batch, as the all-reduce mode
  // computes it (Note [equivalence] in trainer.h). Asynchronous mode applies each worker's
  // gradient alone: the mean over its own rows.
  const float scale = sync_ ? static_cast<float>(num_workers_) / static_cast<float>(global_batch)
                            : 1.0f / static_cast<float>(std::max(rows, 1));
  const std::uint32_t* indices =
      order_.data() + static_cast<std::size_t>(batch) * global_batch + shard_.begin;
  gather_batch(train_, indices, shard_.size(), batch_x_.data(), batch_y_.data());
  const double loss =
      model_->forward_backward(batch_x_.data(), batch_y_.data(), rows, scale, {}, 1);
  strategy.apply_gradients();
  ++position_;
  ++epoch_steps_;
  epoch_done_ = position_ % spe == 0;
  const double mean = loss / std::max(rows, 1);  // forward_backward returns the sum
  epoch_loss_ += mean;
  return mean;
}

EpochStats PsTrainer::end_epoch() {
  EpochStats stats;
  stats.epoch = static_cast<int>((position_ - 1) / std::max(steps_per_epoch(), 1)) + 1;
  stats.steps = epoch_steps_;
  stats.seconds = now_seconds() - epoch_start_;
  const double examples =
      static_cast<double>(epoch_steps_) * static_cast<double>(config_.global_batch_size);
  stats.train_loss = epoch_steps_ > 0 ? epoch_loss_ / epoch_steps_ : 0.0;
  stats.images_per_sec = stats.seconds > 0 ? examples / stats.seconds : 0.0;
  epoch_steps_ = 0;
  epoch_loss_ = 0;
  epoch_done_ = false;
  epoch_start_ = now_seconds();
  return stats;
}

double PsTrainer::evaluate(ParameterServerStrategy& strategy) {
  if (!strategy.should_stop()) strategy.pull();
  const std::size_t chunk = static_cast<std::size_t>(config_.eval_chunk);
  std::size_t correct = 0;
  for (std::size_t begin = 0; begin < test_.size(); begin += chunk) {
    const std::size_t count = std::min(chunk, test_.size() - begin);
    gather_range(test_, begin, count, batch_x_.data(), batch_y_.data());
    correct += model_->count_correct(batch_x_.data(), batch_y_.data(), static_cast<int>(count));
  }
  return static_cast<double>(correct) / static_cast<double>(test_.size());
}

PsSummary ps_summary(const ParameterServerStrategy& strategy) {
  const ParameterServerStats s = strategy.stats();
  PsSummary p;
  p.mode = strategy.options().sync_replicas ? "ps-sync" : "ps-async";
  p.num_ps = strategy.num_ps();
  p.global_step = s.global_step;
  p.pushes = s.pushes;
  p.dropped_stale = s.dropped_stale;
  p.bytes_pushed = s.bytes_pushed;
  p.bytes_pulled = s.bytes_pulled;
  return p;
}

}  // namespace mwms::train
