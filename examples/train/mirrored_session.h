/// @file mirrored_session.h
/// The all-reduce mode's SessionCreator (mwms/session.h) for `train`.
#pragma once

#include <cstdint>
#include <string>

#include "checkpoint.h"
#include "mwms/session.h"
#include "mwms/strategy.h"
#include "trainer.h"

namespace mwms::train {

// The all-reduce mode's SessionCreator: the strategy is connected once (a lost worker ends an
// all-reduce job: restart it with --resume); the chief restores and saves train's own
// checkpoint file (checkpoint.h), which holds whole epochs, so saves happen at epoch ends.
class MirroredSessionCreator : public mwms::SessionCreator {
 public:
  MirroredSessionCreator(mwms::MultiWorkerMirroredStrategy& strategy,
                         Trainer& trainer)
      : strategy_(strategy), trainer_(trainer), steps_per_epoch_(trainer.steps_per_epoch()) {}
  std::int64_t create_session(const std::string&) override {
    if (created_) {
      throw mwms::InvalidUsage("the all-reduce mode does not reconnect a job: restart it with "
                               "--resume");
    }
    created_ = true;
    first_epoch_ = trainer_.prepare();  // the leader restores with --resume; broadcast
    step_ = static_cast<std::int64_t>(first_epoch_) * steps_per_epoch_;
    return step_;
  }
  std::string save(const std::string& dir) override {
    if (steps_per_epoch_ == 0 || step_ % steps_per_epoch_ != 0) {
      throw mwms::InvalidUsage("the all-reduce mode checkpoints at epoch ends only (global step " +
                               std::to_string(step_) + ", " + std::to_string(steps_per_epoch_) +
                               " steps per epoch)");
    }
    trainer_.save(static_cast<int>(step_ / steps_per_epoch_));
    return checkpoint_path(dir);
  }
  std::int64_t global_step() const override { return step_; }
  bool is_chief() const override { return strategy_.is_chief(); }
  void close() override { strategy_.finalize(); }
  void abandon() noexcept override {}
  void advance() { ++step_; }
  int first_epoch() const { return first_epoch_; }

 private:
  mwms::MultiWorkerMirroredStrategy& strategy_;
  Trainer& trainer_;
  std::int64_t steps_per_epoch_;
  bool created_ = false;
  int first_epoch_ = 0;
  std::int64_t step_ = 0;
};

}  // namespace mwms::train
