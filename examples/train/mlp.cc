#include "mlp.h"

#include "mlp_kernels.h"
#include "mwms/optimizer.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>


namespace mwms::train {
namespace {

detail::MlpDims dims(const MlpShape& s) { return {s.inputs, s.hidden, s.classes}; }

void call_ready(const void* ctx, std::size_t piece) {
  (*static_cast<const std::function<void(std::size_t)>*>(ctx))(piece);
}

}  // namespace

Mlp::Mlp(MlpShape shape) : shape_(shape) {
  if (shape.inputs <= 0 || shape.hidden <= 0 || shape.classes <= 1) {
    throw std::invalid_argument("mlp: every layer needs a positive size and >= 2 classes");
  }
  const std::size_t in = shape.inputs, hid = shape.hidden, cls = shape.classes;
  set_layout({{"dense_1/kernel", hid * in},
              {"dense_1/bias", hid},
              {"dense_2/kernel", cls * hid},
              {"dense_2/bias", cls}});
}

std::vector<GlorotFans> Mlp::glorot_fans() const {
  return {{0, shape_.inputs, shape_.hidden}, {2, shape_.hidden, shape_.classes}};
}

void Mlp::reserve(int batch) {
  if (batch <= capacity_) return;
  capacity_ = batch;
  hidden_.resize(std::size_t(shape_.hidden) * batch);
  d_hidden_.resize(std::size_t(shape_.hidden) * batch);
  logits_.resize(std::size_t(shape_.classes) * batch);
}

void Mlp::forward(const float* x, int batch) {
  reserve(batch);
  detail::MlpForwardArgs a;
  a.params = params().data();
  a.dims = dims(shape_);
  a.x = x;
  a.batch = batch;
  a.hidden = hidden_.data();
  a.logits = logits_.data();
  detail::mlp_kernels().forward(a);  // Note [train cpu dispatch]
}

// Note [backprop order]: the output layer's gradients are final first, then dense_1's kernel,
// computed in blocks of input columns (each block is d_hidden times a block of the input rows,
// contiguous in the column-major kernel) so that its all-reduce can start block by block, then
// dense_1's bias. Blocks end on whole columns; a block's values do not depend on the blocking.
std::vector<TensorSlot> Mlp::backprop_order(int w1_blocks) const {
  if (w1_blocks < 1 || w1_blocks > shape_.inputs) {
    throw std::invalid_argument("mlp: w1_blocks must be in [1, inputs]");
  }
  std::vector<TensorSlot> order = {slots()[2], slots()[3]};
  const std::size_t rows = static_cast<std::size_t>(shape_.hidden);
  for (int k = 0; k < w1_blocks; ++k) {
    const std::size_t c0 = static_cast<std::size_t>(shape_.inputs) * k / w1_blocks;
    const std::size_t c1 = static_cast<std::size_t>(shape_.inputs) * (k + 1) / w1_blocks;
    order.push_back({slots()[0].name + "/" + std::to_string(k), c0 * rows, (c1 - c0) * rows});
  }
  order.push_back(slots()[1]);
  return order;
}

double Mlp::forward_backward(const float* x, const std::uint8_t* labels, int batch,
                             float grad_scale, const std::function<void(std::size_t)>& ready,
                             int w1_blocks) {
  const std::size_t pieces = static_cast<std::size_t>(w1_blocks) + 3;
  if (batch == 0) {
    std::fill(gradients().begin(), gradients().end(), 0.0f);
    if (ready) {
      for (std::size_t i = 0; i < pieces; ++i) ready(i);
    }
    return 0.0;
  }
  forward(x, batch);
  // The logits buffer becomes d loss / d logits = grad_scale * (softmax - one_hot).
  const double loss =
      softmax_cross_entropy(logits_.data(), labels, batch, shape_.classes, grad_scale);
  detail::MlpBackwardArgs a;
  a.params = params().data();
  a.grads = gradients().data();
  a.dims = dims(shape_);
  a.x = x;
  a.batch = batch;
  a.hidden = hidden_.data();
  a.d_logits = logits_.data();
  a.d_hidden = d_hidden_.data();
  if (ready) {
    a.ready = &call_ready;
    a.ctx = &ready;
  }
  a.w1_blocks = w1_blocks;
  detail::mlp_kernels().backward(a);
  return loss;
}

std::size_t Mlp::count_correct(const float* x, const std::uint8_t* labels, int batch) {
  if (batch == 0) return 0;
  forward(x, batch);
  return count_argmax_correct(logits_.data(), labels, batch, shape_.classes);
}

SgdMomentum::SgdMomentum(std::size_t count, float learning_rate, float momentum)
    : learning_rate_(learning_rate), momentum_(momentum), velocity_(count, 0.0f) {}

// The library's momentum optimizer (mwms/optimizer.h): the parameter servers run the same code on
// their shards, so the all-reduce and the ps-sync modes compute bit-identical updates, and it is
// built without FMA contraction whatever flags this program has (-DMWMS_NATIVE_ARCH=ON).
void SgdMomentum::step(FloatBuffer& params, const FloatBuffer& grads) {
  OptimizerOptions o;
  o.kind = OptimizerKind::kMomentum;
  o.learning_rate = learning_rate_;
  o.momentum = momentum_;
  float* slots[] = {velocity_.data()};
  apply_gradient(o, params.data(), grads.data(), slots, params.size(), 1);
}

}  // namespace mwms::train
