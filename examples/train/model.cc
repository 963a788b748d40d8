#include "model.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "rng.h"

namespace mwms::train {

void glorot_uniform_init(std::uint64_t seed, const std::vector<TensorSlot>& slots,
                         const std::vector<GlorotFans>& fans, float* params, std::size_t count) {
  for (const TensorSlot& slot : slots) {
    if (slot.offset + slot.count > count) {
      throw std::invalid_argument("glorot_uniform_init: " + slot.name + " ends at " +
                                  std::to_string(slot.offset + slot.count) + ", beyond the " +
                                  std::to_string(count) + " parameters");
    }
  }
  for (const GlorotFans& f : fans) {
    if (f.slot >= slots.size()) {
      throw std::invalid_argument("glorot_uniform_init: kernel slot " + std::to_string(f.slot) +
                                  " of " + std::to_string(slots.size()));
    }
  }
  std::mt19937_64 rng(mix_seed(seed, kInitStream));
  std::fill(params, params + count, 0.0f);
  for (const GlorotFans& f : fans) {
    const float bound = std::sqrt(6.0f / static_cast<float>(f.fan_in + f.fan_out));
    const TensorSlot& slot = slots[f.slot];
    for (std::size_t i = 0; i < slot.count; ++i) {
      params[slot.offset + i] = uniform_symmetric(rng, bound);
    }
  }
}

void Model::set_layout(const std::vector<std::pair<std::string, std::size_t>>& tensors) {
  slots_.clear();
  std::size_t offset = 0;
  for (const auto& [name, count] : tensors) {
    slots_.push_back({name, offset, count});
    offset += count;
  }
  params_.assign(offset, 0.0f);
  grads_.assign(offset, 0.0f);
}

void Model::init(std::uint64_t seed) {
  glorot_uniform_init(seed, slots_, glorot_fans(), params_.data(), params_.size());
}


double softmax_cross_entropy(float* logits, const std::uint8_t* labels, int batch, int classes,
                             float grad_scale) {
  double loss = 0.0;
  for (int j = 0; j < batch; ++j) {
    float* z = logits + std::size_t(j) * classes;
    const float zmax = *std::max_element(z, z + classes);
    const float shifted_label_logit = z[labels[j]] - zmax;
    float sum = 0.0f;
    for (int k = 0; k < classes; ++k) {
      z[k] = std::exp(z[k] - zmax);
      sum += z[k];
    }
    const float inv = 1.0f / sum;
    loss += std::log(static_cast<double>(sum)) - static_cast<double>(shifted_label_logit);
    for (int k = 0; k < classes; ++k) z[k] *= inv * grad_scale;
    z[labels[j]] -= grad_scale;
  }
  return loss;
}

std::size_t count_argmax_correct(const float* logits, const std::uint8_t* labels, int batch,
                                 int classes) {
  std::size_t correct = 0;
  for (int j = 0; j < batch; ++j) {
    const float* z = logits + std::size_t(j) * classes;
    const auto best = std::max_element(z, z + classes) - z;
    correct += (best == labels[j]) ? 1 : 0;
  }
  return correct;
}

}  // namespace mwms::train
