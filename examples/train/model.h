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
#include <utility>
#include <vector>

#include "aligned_buffer.h"

namespace mwms::train {

/// Where one named tensor sits inside the flat parameter (and gradient) vector.
struct TensorSlot {
  std::string name;
  std::size_t offset = 0;
  std::size_t count = 0;
};

/// A kernel tensor's Glorot fans: slot index into Model::slots(), fan_in and fan_out.
struct GlorotFans {
  std::size_t slot = 0;
  int fan_in = 0;
  int fan_out = 0;
};

/// Note [model layout]: every model keeps its tensors back to back in ONE flat parameter vector
/// and its gradients in a second with the same layout (Note [flat parameters] in mlp.h); Model
/// owns both and the slot table, built once by the subclass's constructor with set_layout(), and
/// the Glorot initialisation (glorot_init()), so the MLP, the CNN and their GPU versions
/// (gpu_model.h, which copy this layout and this init to the device) cannot drift apart.
class Model {
 public:
  virtual ~Model() = default;

  /// The tensors, back to back in params() (and gradients()), in layer order.
  const std::vector<TensorSlot>& slots() const noexcept { return slots_; }
  FloatBuffer& params() noexcept { return params_; }
  const FloatBuffer& params() const noexcept { return params_; }
  FloatBuffer& gradients() noexcept { return grads_; }
  const FloatBuffer& gradients() const noexcept { return grads_; }

  /// Glorot-uniform kernels (Keras' default), zero biases, from a generator seeded with `seed`
  /// only: identical on every worker, replica and platform. Kernels are filled in glorot_fans()
  /// order from one generator.
  void init(std::uint64_t seed);

  /// The kernels init() fills and their fans (a convolution's fans are taps x input channels and
  /// taps x filters, as Keras computes them); every other tensor is a zero bias.
  virtual std::vector<GlorotFans> glorot_fans() const = 0;

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

 protected:
  /// Lays out `tensors` (name, element count) back to back in layer order (Note [model layout])
  /// and sizes params() and gradients() to their total, zeroed. Called once, by the constructor.
  void set_layout(const std::vector<std::pair<std::string, std::size_t>>& tensors);

 private:
  std::vector<TensorSlot> slots_;
  FloatBuffer params_;
  FloatBuffer grads_;
};

/// Fills `params` (`count` floats laid out as `slots`) with zeros, then each kernel of `fans`, in
/// that order, with Glorot-uniform values (bound sqrt(6 / (fan_in + fan_out))) from one
/// std::mt19937_64 seeded with mix_seed(seed, kInitStream) (rng.h): what Model::init() does,
/// for any buffer with a model's layout. @throws std::invalid_argument when a slot ends beyond
/// `count` or a kernel's slot index is not in `slots`.
void glorot_uniform_init(std::uint64_t seed, const std::vector<TensorSlot>& slots,
                         const std::vector<GlorotFans>& fans, float* params, std::size_t count);

/// Softmax cross-entropy on `batch` columns of `classes` logits (column-major, one example per
/// column), stabilised by each column's max. Overwrites the logits with
/// d loss / d logits = grad_scale * (softmax - one_hot) and returns sum_i loss_i.
double softmax_cross_entropy(float* logits, const std::uint8_t* labels, int batch, int classes,
                             float grad_scale);

/// Number of the `batch` columns of `classes` logits whose arg-max equals the label.
std::size_t count_argmax_correct(const float* logits, const std::uint8_t* labels, int batch,
                                 int classes);

}  // namespace mwms::train
