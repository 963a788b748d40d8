/// @file gpu_ops.h
/// The element operations and index maps of the GPU models (gpu_model.cu), as `__host__
/// __device__` inline functions: the CUDA kernels apply them to device buffers, and the CPU unit
/// tests (tests/unit/train/gpu_ops_test.cc) check them against the CPU models (model.cc, mlp.cc,
/// cnn.cc) without a GPU. No CUDA header is needed to include this file.
///
/// Note [gpu layout]: the GPU models keep parameters and gradients in the CPU Model's flat
/// layout (Note [model layout] in model.h), so a gradient all-reduces as one bucket and a
/// checkpoint is the same bytes. Two tensors need another order for cuDNN, and are converted by
/// a small kernel on every pass, never stored so in the flat buffers:
///   - conv2d/kernel is filters x taps column-major on the CPU (tap t of filter f at
///     t * filters + f), cuDNN's NCHW filter (KCRS, one input channel) wants f * taps + t:
///     kernel_kcrs_index() maps a CPU index to the cuDNN one (forward: gather the kernel; backward:
///     scatter BackwardFilter's result into the gradient slot).
///   - the convolution, its ReLU and the max-pool run in NCHW (every cuDNN algorithm supports it
///     for float), but Flatten's order, which dense_1's kernel columns follow (Note [cnn layout]),
///     is NHWC: (row, column, channel). pooled_nhwc_index() maps an NCHW pooled index to its place
///     in the features x batch matrix (forward: to the dense layer; backward: d_features back to
///     NCHW for cudnnPoolingBackward).
/// Dense layers are cuBLAS sgemm on the same column-major matrices as Eigen's (one example per
/// column), so they need no conversion.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define MWMS_TRAIN_HD __host__ __device__
#else
#define MWMS_TRAIN_HD
#endif

namespace mwms::train::gpu_ops {

/// Where element `cpu_index` of conv2d/kernel (CPU layout: filters x taps, column-major) sits in
/// cuDNN's KCRS filter with one input channel (Note [gpu layout]). A bijection on
/// [0, filters * taps).
MWMS_TRAIN_HD inline std::size_t kernel_kcrs_index(std::size_t cpu_index, int filters, int taps) {
  const std::size_t tap = cpu_index / static_cast<std::size_t>(filters);
  const std::size_t filter = cpu_index % static_cast<std::size_t>(filters);
  return filter * static_cast<std::size_t>(taps) + tap;
}

/// Where element `nchw_index` of the pooled NCHW tensor (batch x filters x side x side) sits in
/// the features x batch matrix of Flatten's NHWC order (Note [gpu layout], Note [cnn layout]).
/// A bijection on [0, batch * filters * side * side).
MWMS_TRAIN_HD inline std::size_t pooled_nhwc_index(std::size_t nchw_index, int filters, int side) {
  const std::size_t area = static_cast<std::size_t>(side) * static_cast<std::size_t>(side);
  const std::size_t per_image = area * static_cast<std::size_t>(filters);
  const std::size_t image = nchw_index / per_image;
  const std::size_t rest = nchw_index % per_image;
  const std::size_t channel = rest / area;
  const std::size_t position = rest % area;  // row * side + column
  return image * per_image + position * static_cast<std::size_t>(filters) + channel;
}

/// Softmax cross-entropy of one example's `classes` logits `z`, the same arithmetic as
/// softmax_cross_entropy() in model.cc (float exponentials and sum, stabilised by the max, the
/// loss in double): overwrites z with grad_scale * (softmax - one_hot(label)) and returns the
/// example's loss.
MWMS_TRAIN_HD inline double softmax_xent_column(float* z, int label, int classes,
                                                float grad_scale) {
  float zmax = z[0];
  for (int k = 1; k < classes; ++k) zmax = z[k] > zmax ? z[k] : zmax;
  const float shifted_label_logit = z[label] - zmax;
  float sum = 0.0f;
  for (int k = 0; k < classes; ++k) {
    z[k] = expf(z[k] - zmax);
    sum += z[k];
  }
  const float inv = 1.0f / sum;
  const double loss = log(static_cast<double>(sum)) - static_cast<double>(shifted_label_logit);
  for (int k = 0; k < classes; ++k) z[k] *= inv * grad_scale;
  z[label] -= grad_scale;
  return loss;
}

/// Arg-max of one example's `classes` logits, the first of equal values (std::max_element's
/// choice in count_argmax_correct()).
MWMS_TRAIN_HD inline int argmax_column(const float* z, int classes) {
  int best = 0;
  for (int k = 1; k < classes; ++k) best = z[k] > z[best] ? k : best;
  return best;
}

/// A dense layer's pre-activation plus its bias, through ReLU when `relu` (the CPU models'
/// (W x + b).cwiseMax(0)).
MWMS_TRAIN_HD inline float bias_activation(float z, float bias, bool relu) {
  const float v = z + bias;
  return relu ? (v > 0.0f ? v : 0.0f) : v;
}

/// ReLU's backward pass from its OUTPUT y (the CPU models' rule: active where y > 0).
MWMS_TRAIN_HD inline float relu_backward(float dy, float y) { return y > 0.0f ? dy : 0.0f; }

/// SGD with momentum in PyTorch's form, one element: v = momentum * v + g; p -= lr * v
/// (SgdMomentum::step in mlp.h).
MWMS_TRAIN_HD inline void sgd_momentum(float& p, float& v, float g, float learning_rate,
                                       float momentum) {
  v = momentum * v + g;
  p -= learning_rate * v;
}

}  // namespace mwms::train::gpu_ops
