#include "cnn.h"

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>


namespace mwms::train {
namespace {

using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic>;  // column-major
using Vector = Eigen::Matrix<float, Eigen::Dynamic, 1>;
using MatrixMap = Eigen::Map<Matrix>;
using ConstMatrixMap = Eigen::Map<const Matrix>;
using VectorMap = Eigen::Map<Vector>;

constexpr int kTaps = 9;  // 3x3 kernel, one input channel

}  // namespace

Cnn::Cnn(CnnShape shape) : shape_(shape) {
  if (shape.side < 4 || (shape.side - 2) % 2 != 0 || shape.filters <= 0 || shape.dense <= 0 ||
      shape.classes <= 1) {
    throw std::invalid_argument(
        "cnn: images need an even side >= 4 (side - 2 is pooled by 2), every layer a positive "
        "size and >= 2 classes; got side " +
        std::to_string(shape.side));
  }
  conv_side_ = shape.side - 2;
  pool_side_ = conv_side_ / 2;
  features_ = shape.filters * pool_side_ * pool_side_;
  const std::size_t f = shape.filters, feat = features_, d = shape.dense, c = shape.classes;
  set_layout({{"conv2d/kernel", f * kTaps},
              {"conv2d/bias", f},
              {"dense_1/kernel", d * feat},
              {"dense_1/bias", d},
              {"dense_2/kernel", c * d},
              {"dense_2/bias", c}});
}

std::vector<GlorotFans> Cnn::glorot_fans() const {
  return {{0, kTaps, kTaps * shape_.filters},
          {2, features_, shape_.dense},
          {4, shape_.dense, shape_.classes}};
}

void Cnn::reserve(int batch) {
  if (batch <= capacity_) return;
  capacity_ = batch;
  const std::size_t columns = std::size_t(conv_side_) * conv_side_ * batch;
  cols_.resize(kTaps * columns);
  conv_.resize(std::size_t(shape_.filters) * columns);
  d_conv_.resize(conv_.size());
  pooled_.resize(std::size_t(features_) * batch);
  d_pooled_.resize(pooled_.size());
  argmax_.resize(pooled_.size());
  hidden_.resize(std::size_t(shape_.dense) * batch);
  d_hidden_.resize(hidden_.size());
  logits_.resize(std::size_t(shape_.classes) * batch);
}

void Cnn::forward(const float* x, int batch) {
  reserve(batch);
  const int side = shape_.side, cs = conv_side_, ps = pool_side_, filters = shape_.filters;
  const std::size_t positions = std::size_t(cs) * cs;
  const std::size_t columns = positions * batch;
  // im2col (Note [cnn layout]): tap ky*3+kx of output (oy, ox) is pixel (oy+ky, ox+kx).
  float* col = cols_.data();
  for (int b = 0; b < batch; ++b) {
    const float* image = x + std::size_t(b) * side * side;
    for (int oy = 0; oy < cs; ++oy) {
      for (int ox = 0; ox < cs; ++ox) {
        for (int ky = 0; ky < 3; ++ky) {
          const float* row = image + (oy + ky) * side + ox;
          *col++ = row[0];
          *col++ = row[1];
          *col++ = row[2];
        }
      }
    }
  }
  const float* p = params().data();
  ConstMatrixMap wc(p + slots()[0].offset, filters, kTaps);
  Eigen::Map<const Vector> bc(p + slots()[1].offset, filters);
  ConstMatrixMap w1(p + slots()[2].offset, shape_.dense, features_);
  Eigen::Map<const Vector> b1(p + slots()[3].offset, shape_.dense);
  ConstMatrixMap w2(p + slots()[4].offset, shape_.classes, shape_.dense);
  Eigen::Map<const Vector> b2(p + slots()[5].offset, shape_.classes);
  MatrixMap conv(conv_.data(), filters, Eigen::Index(columns));
  conv.noalias() = wc * ConstMatrixMap(cols_.data(), kTaps, Eigen::Index(columns));
  conv = (conv.colwise() + bc).cwiseMax(0.0f);
  // Max-pool 2x2, stride 2, keeping each maximum's index in conv_ for the backward pass.
  for (int b = 0; b < batch; ++b) {
    float* out = pooled_.data() + std::size_t(b) * features_;
    std::uint32_t* arg = argmax_.data() + std::size_t(b) * features_;
    for (int py = 0; py < ps; ++py) {
      for (int px = 0; px < ps; ++px) {
        const std::size_t c00 = std::size_t(b) * positions + std::size_t(2 * py) * cs + 2 * px;
        const std::size_t window[4] = {c00, c00 + 1, c00 + cs, c00 + cs + 1};
        for (int f = 0; f < filters; ++f) {
          std::size_t best = window[0] * filters + f;
          for (int w = 1; w < 4; ++w) {
            const std::size_t at = window[w] * filters + f;
            if (conv_[at] > conv_[best]) best = at;
          }
          *out++ = conv_[best];
          *arg++ = static_cast<std::uint32_t>(best);
        }
      }
    }
  }
  MatrixMap hidden(hidden_.data(), shape_.dense, batch);
  MatrixMap logits(logits_.data(), shape_.classes, batch);
  hidden.noalias() = w1 * ConstMatrixMap(pooled_.data(), features_, batch);
  hidden = (hidden.colwise() + b1).cwiseMax(0.0f);
  logits.noalias() = w2 * hidden;
  logits.colwise() += b2;
}

std::vector<TensorSlot> Cnn::backprop_order(int blocks) const {
  if (blocks != 1) throw std::invalid_argument("cnn: backprop_order supports 1 block only");
  return {slots()[4], slots()[5], slots()[2], slots()[3], slots()[0], slots()[1]};
}

double Cnn::forward_backward(const float* x, const std::uint8_t* labels, int batch,
                             float grad_scale, const std::function<void(std::size_t)>& ready,
                             int blocks) {
  if (blocks != 1) throw std::invalid_argument("cnn: forward_backward supports 1 block only");
  const auto done = [&](std::size_t i) {
    if (ready) ready(i);
  };
  if (batch == 0) {
    std::fill(gradients().begin(), gradients().end(), 0.0f);
    for (std::size_t i = 0; i < slots().size(); ++i) done(i);
    return 0.0;
  }
  forward(x, batch);
  const double loss =
      softmax_cross_entropy(logits_.data(), labels, batch, shape_.classes, grad_scale);
  const int filters = shape_.filters;
  const std::size_t columns = std::size_t(conv_side_) * conv_side_ * batch;
  const float* p = params().data();
  float* g = gradients().data();
  ConstMatrixMap w1(p + slots()[2].offset, shape_.dense, features_);
  ConstMatrixMap w2(p + slots()[4].offset, shape_.classes, shape_.dense);
  MatrixMap d_logits(logits_.data(), shape_.classes, batch);
  MatrixMap hidden(hidden_.data(), shape_.dense, batch);
  MatrixMap d_hidden(d_hidden_.data(), shape_.dense, batch);
  ConstMatrixMap pooled(pooled_.data(), features_, batch);
  MatrixMap d_pooled(d_pooled_.data(), features_, batch);

  MatrixMap(g + slots()[4].offset, shape_.classes, shape_.dense).noalias() =
      d_logits * hidden.transpose();
  done(0);
  VectorMap(g + slots()[5].offset, shape_.classes) = d_logits.rowwise().sum();
  done(1);
  d_hidden.noalias() = w2.transpose() * d_logits;
  d_hidden = (hidden.array() > 0.0f).select(d_hidden, 0.0f);  // ReLU: active where output > 0
  MatrixMap(g + slots()[2].offset, shape_.dense, features_).noalias() =
      d_hidden * pooled.transpose();
  done(2);
  VectorMap(g + slots()[3].offset, shape_.dense) = d_hidden.rowwise().sum();
  done(3);
  d_pooled.noalias() = w1.transpose() * d_hidden;
  // Through the pool (to each window's maximum, Note [cnn layout]) and the conv's ReLU.
  std::fill(d_conv_.begin(), d_conv_.begin() + std::ptrdiff_t(filters * columns), 0.0f);
  const std::size_t pooled_count = std::size_t(features_) * batch;
  for (std::size_t i = 0; i < pooled_count; ++i) {
    const std::uint32_t at = argmax_[i];
    if (conv_[at] > 0.0f) d_conv_[at] = d_pooled_[i];
  }
  MatrixMap d_conv(d_conv_.data(), filters, Eigen::Index(columns));
  MatrixMap(g + slots()[0].offset, filters, kTaps).noalias() =
      d_conv * ConstMatrixMap(cols_.data(), kTaps, Eigen::Index(columns)).transpose();
  done(4);
  VectorMap(g + slots()[1].offset, filters) = d_conv.rowwise().sum();
  done(5);
  return loss;
}

std::size_t Cnn::count_correct(const float* x, const std::uint8_t* labels, int batch) {
  if (batch == 0) return 0;
  forward(x, batch);
  return count_argmax_correct(logits_.data(), labels, batch, shape_.classes);
}

}  // namespace mwms::train
