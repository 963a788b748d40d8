#include "model.h"

#include <algorithm>
#include <cmath>

namespace mwms::train {

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
