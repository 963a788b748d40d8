/// @file mlp.h
/// A two-layer perceptron (inputs -> hidden ReLU -> classes, softmax cross-entropy) on the CPU
/// with Eigen, float32, and SGD with momentum.
///
/// Note [flat parameters]: W1, b1, W2, b2 live in ONE contiguous, 64-byte aligned vector, and
/// their gradients in a second vector with the same layout, so the strategy can all-reduce the
/// gradient as one tensor in place and a checkpoint is a single copy. Every tensor's offset is a
/// multiple of 16 floats for the default shape, so each starts on a cache line as well.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "aligned_buffer.h"
#include "model.h"

namespace mwms::train {

/// Layer sizes; defaults are Fashion-MNIST's 28x28 images and 10 classes.
struct MlpShape {
  int inputs = 784;
  int hidden = 256;
  int classes = 10;
};

class Mlp : public Model {
 public:
  explicit Mlp(MlpShape shape = {});

  const MlpShape& shape() const noexcept { return shape_; }
  // slots(): dense_1/kernel (hidden x inputs), dense_1/bias, dense_2/kernel (classes x hidden),
  // dense_2/bias, in this order, back to back (Note [model layout] in model.h).

  /// dense_1/kernel (fans inputs, hidden) and dense_2/kernel (hidden, classes): TF Dense's
  /// Glorot-uniform default, filled in that order by Model::init().
  std::vector<GlorotFans> glorot_fans() const override;

  /// Grows the activation buffers to hold `batch` examples; steps with at most this many examples
  /// then allocate nothing.
  void reserve(int batch) override;

  /// Forward and backward pass on `batch` examples. `x` holds the examples one after another
  /// (inputs floats each), i.e. an inputs x batch column-major matrix. Overwrites gradients() with
  /// grad_scale * sum over the examples of d loss_i / d params, and returns sum_i loss_i.
  /// `batch` may be 0 (gradients become zero).
  ///
  /// With `ready` set, calls ready(i) as soon as tensor i of backprop_order(w1_blocks) is final
  /// (Note [backprop order]), so a caller can start its all-reduce while the rest is computed.
  double forward_backward(const float* x, const std::uint8_t* labels, int batch, float grad_scale,
                          const std::function<void(std::size_t)>& ready = {},
                          int w1_blocks = 1) override;

  /// The gradient as tensors in the order forward_backward() makes them final: dense_2/kernel,
  /// dense_2/bias, dense_1/kernel in `w1_blocks` blocks of whole input columns (contiguous,
  /// column-major), dense_1/bias. Offsets into gradients(). @throws std::invalid_argument when
  /// w1_blocks is not in [1, inputs].
  std::vector<TensorSlot> backprop_order(int w1_blocks) const override;

  /// Number of the `batch` examples whose arg-max prediction equals the label.
  std::size_t count_correct(const float* x, const std::uint8_t* labels, int batch) override;

 private:
  void forward(const float* x, int batch);

  MlpShape shape_;
  int capacity_ = 0;
  FloatBuffer hidden_;   // hidden x batch: ReLU activations
  FloatBuffer logits_;   // classes x batch: logits, then d loss / d logits in place
  FloatBuffer d_hidden_; // hidden x batch
};

/// SGD with momentum (TF 1's MomentumOptimizer, PyTorch's form): v = momentum * v + g; p -= lr * v,
/// through mwms::apply_gradient (mwms/optimizer.h).
class SgdMomentum {
 public:
  SgdMomentum(std::size_t count, float learning_rate, float momentum);
  void step(FloatBuffer& params, const FloatBuffer& grads);
  FloatBuffer& velocity() noexcept { return velocity_; }
  const FloatBuffer& velocity() const noexcept { return velocity_; }

 private:
  float learning_rate_;
  float momentum_;
  FloatBuffer velocity_;
};

}  // namespace mwms::train
