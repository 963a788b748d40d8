/// @file cnn.h
/// The CNN of TensorFlow's multi-worker Keras tutorial, as issue 6 gives it, on the CPU with
/// Eigen, float32: Conv2D(32, 3x3, valid) + ReLU, MaxPool 2x2 (stride 2), Flatten, Dense(64) +
/// ReLU, Dense(10), softmax cross-entropy. For 28x28 images: 26x26x32 after the convolution,
/// 13x13x32 = 5408 features after the pool, 347,146 parameters. This is the CPU reference; a GPU
/// version (cuDNN) is separate work.
///
/// Note [cnn layout]: the convolution is im2col + one GEMM: cols is 9 x (positions x batch)
/// (column p of image b holds the 3x3 patch under output position p), so the convolution's
/// output, kernel (filters x 9) times cols, is filters x (positions x batch) with one column per
/// output position, channels contiguous. The pool reads 2x2 windows of those columns and writes
/// the flattened features in (row, column, channel) order, TF's NHWC Flatten order, one example
/// per column; it keeps the index of each window's maximum for the backward pass (the first of
/// equal values), which routes each pooled gradient to that one position. Pool windows do not
/// overlap (stride 2, even conv side), so every conv position gets at most one gradient.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "aligned_buffer.h"
#include "model.h"

namespace mwms::train {

/// Layer sizes; defaults are the tutorial's on Fashion-MNIST's 28x28 images and 10 classes.
struct CnnShape {
  int side = 28;     ///< input images are side x side, one channel
  int filters = 32;  ///< 3x3 convolution kernels
  int dense = 64;    ///< units of the hidden dense layer
  int classes = 10;
};

class Cnn : public Model {
 public:
  /// @throws std::invalid_argument when a size is not positive, side - 2 is odd or below 2, or
  /// there are fewer than 2 classes.
  explicit Cnn(CnnShape shape = {});

  const CnnShape& shape() const noexcept { return shape_; }
  // slots(): conv2d/kernel (filters x 9, column-major), conv2d/bias, dense_1/kernel
  // (dense x features), dense_1/bias, dense_2/kernel (classes x dense), dense_2/bias, back to back
  // (Note [model layout] in model.h).

  /// conv2d/kernel (fans 9, 9 x filters: Keras' Conv2D), dense_1/kernel (features, dense),
  /// dense_2/kernel (dense, classes), filled in that order by Model::init().
  std::vector<GlorotFans> glorot_fans() const override;
  void reserve(int batch) override;
  /// See Model::forward_backward; `blocks` must be 1 (no layer is split).
  double forward_backward(const float* x, const std::uint8_t* labels, int batch, float grad_scale,
                          const std::function<void(std::size_t)>& ready = {},
                          int blocks = 1) override;
  /// dense_2/kernel, dense_2/bias, dense_1/kernel, dense_1/bias, conv2d/kernel, conv2d/bias.
  /// @throws std::invalid_argument unless blocks == 1.
  std::vector<TensorSlot> backprop_order(int blocks) const override;
  std::size_t count_correct(const float* x, const std::uint8_t* labels, int batch) override;

  /// Features after the pool: filters x (side - 2)^2 / 4.
  int features() const noexcept { return features_; }

 private:
  void forward(const float* x, int batch);

  CnnShape shape_;
  int conv_side_ = 0;  // side - 2
  int pool_side_ = 0;  // conv_side / 2
  int features_ = 0;   // filters * pool_side^2
  int capacity_ = 0;
  FloatBuffer cols_;  // 9 x (conv_side^2 * batch), Note [cnn layout]
  FloatBuffer conv_;  // filters x (conv_side^2 * batch): ReLU activations
  FloatBuffer d_conv_;
  FloatBuffer pooled_;  // features x batch
  FloatBuffer d_pooled_;
  std::vector<std::uint32_t> argmax_;  // per pooled value: its index in conv_
  FloatBuffer hidden_;                 // dense x batch: ReLU activations
  FloatBuffer d_hidden_;
  FloatBuffer logits_;  // classes x batch, then d loss / d logits
};

}  // namespace mwms::train
