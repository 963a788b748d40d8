/// @file model.h
/// What the trainer needs of a model (the MLP of mlp.h, the CNN of cnn.h): flat float32
/// parameters and gradients (Note [flat parameters] in mlp.h), a forward + backward pass on a
/// batch, the gradient's tensors in backprop order, and a count of correct predictions. A model
/// is used by one thread at a time; each local replica holds its own (Note [replica models] in
/// trainer.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "aligned_buffer.h"

namespace mwms::train {

/// Where one named tensor sits inside the flat parameter (and gradient) vector.
struct TensorSlot {
  std::string name;
  std::size_t offset = 0;
  std::size_t count = 0;
};

class Model {
 public:
  virtual ~Model() = default;

  /// The tensors, back to back in params() (and gradients()), in layer order.
  virtual const std::vector<TensorSlot>& slots() const noexcept = 0;
  virtual FloatBuffer& params() noexcept = 0;
  virtual const FloatBuffer& params() const noexcept = 0;
  virtual FloatBuffer& gradients() noexcept = 0;

  /// Glorot-uniform kernels (Keras' default), zero biases, from a generator seeded with `seed`
  /// only: identical on every worker and replica.
  virtual void init(std::uint64_t seed) = 0;

  /// Grows the activation buffers to hold `batch` examples; passes over at most that many then
  /// allocate nothing.
  virtual void reserve(int batch) = 0;

  /// Forward and backward pass on `batch` examples (`x`: one image after another, `labels`: one
  /// byte each). Overwrites gradients() with grad_scale * sum over the examples of
  /// d loss_i / d params and returns sum_i loss_i (softmax cross-entropy). `batch` may be 0
  /// (gradients become zero). With `ready` set, calls ready(i) as soon as tensor i of
  /// backprop_order(blocks) is final. @throws std::invalid_argument for a `blocks` the model
  /// does not support.
  virtual double forward_backward(const float* x, const std::uint8_t* labels, int batch,
                                  float grad_scale, const std::function<void(std::size_t)>& ready,
                                  int blocks) = 0;

  /// The gradient's tensors in the order forward_backward() makes them final (last layer first),
  /// the first layer's kernel in `blocks` pieces where the model supports that. @throws
  /// std::invalid_argument for an unsupported `blocks`.
  virtual std::vector<TensorSlot> backprop_order(int blocks) const = 0;

  /// Number of the `batch` examples whose arg-max prediction equals the label.
  virtual std::size_t count_correct(const float* x, const std::uint8_t* labels, int batch) = 0;
};

/// Softmax cross-entropy on `batch` columns of `classes` logits (column-major, one example per
/// column), stabilised by each column's max. Overwrites the logits with
/// d loss / d logits = grad_scale * (softmax - one_hot) and returns sum_i loss_i.
double softmax_cross_entropy(float* logits, const std::uint8_t* labels, int batch, int classes,
                             float grad_scale);

/// Number of the `batch` columns of `classes` logits whose arg-max equals the label.
std::size_t count_argmax_correct(const float* logits, const std::uint8_t* labels, int batch,
                                 int classes);

}  // namespace mwms::train
