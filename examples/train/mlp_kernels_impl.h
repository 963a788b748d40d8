// The body of the MLP kernels (mlp_kernels.h), included once per ISA level by mlp_kernels.cc,
// mlp_kernels_v3.cc and mlp_kernels_v4.cc with MWMS_MLP_LEVEL set to that level's namespace and,
// for the non-baseline levels, Eigen renamed (Note [train cpu dispatch]). Not a header to include
// anywhere else.
#ifndef MWMS_MLP_LEVEL
#error "mlp_kernels_impl.h needs MWMS_MLP_LEVEL (see mlp_kernels.cc)"
#endif

#include <Eigen/Core>

#include "mlp_kernels.h"

namespace mwms::train::detail::MWMS_MLP_LEVEL {
namespace {

using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic>;  // column-major
using ConstMatrixMap = Eigen::Map<const Matrix>;
using ConstVectorMap = Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, 1>>;
using VectorMap = Eigen::Map<Eigen::Matrix<float, Eigen::Dynamic, 1>>;

std::size_t w1_size(const MlpDims& d) { return std::size_t(d.hidden) * d.inputs; }
std::size_t w2_offset(const MlpDims& d) { return std::size_t(d.hidden) * (d.inputs + 1); }
std::size_t b2_offset(const MlpDims& d) { return w2_offset(d) + std::size_t(d.classes) * d.hidden; }

void forward(const MlpForwardArgs& a) {
  const MlpDims& d = a.dims;
  ConstMatrixMap w1(a.params, d.hidden, d.inputs);
  ConstVectorMap b1(a.params + w1_size(d), d.hidden);
  ConstMatrixMap w2(a.params + w2_offset(d), d.classes, d.hidden);
  ConstVectorMap b2(a.params + b2_offset(d), d.classes);
  ConstMatrixMap in(a.x, d.inputs, a.batch);
  Eigen::Map<Matrix> hidden(a.hidden, d.hidden, a.batch);
  Eigen::Map<Matrix> logits(a.logits, d.classes, a.batch);
  hidden.noalias() = w1 * in;
  hidden = (hidden.colwise() + b1).cwiseMax(0.0f);
  logits.noalias() = w2 * hidden;
  logits.colwise() += b2;
}

void backward(const MlpBackwardArgs& a) {
  const MlpDims& d = a.dims;
  Eigen::Map<Matrix> g_w1(a.grads, d.hidden, d.inputs);
  VectorMap g_b1(a.grads + w1_size(d), d.hidden);
  Eigen::Map<Matrix> g_w2(a.grads + w2_offset(d), d.classes, d.hidden);
  VectorMap g_b2(a.grads + b2_offset(d), d.classes);
  ConstMatrixMap w2(a.params + w2_offset(d), d.classes, d.hidden);
  ConstMatrixMap in(a.x, d.inputs, a.batch);
  ConstMatrixMap hidden(a.hidden, d.hidden, a.batch);
  ConstMatrixMap d_logits(a.d_logits, d.classes, a.batch);
  Eigen::Map<Matrix> d_hidden(a.d_hidden, d.hidden, a.batch);
  const auto ready = [&a](std::size_t piece) {
    if (a.ready) a.ready(a.ctx, piece);
  };
  g_w2.noalias() = d_logits * hidden.transpose();
  ready(0);
  g_b2 = d_logits.rowwise().sum();
  ready(1);
  d_hidden.noalias() = w2.transpose() * d_logits;
  // ReLU derivative: hidden holds max(pre-activation, 0), so hidden > 0 marks the active units.
  d_hidden = (hidden.array() > 0.0f).select(d_hidden, 0.0f);
  const int blocks = a.ready ? a.w1_blocks : 1;
  for (int k = 0; k < blocks; ++k) {  // Note [backprop order] in mlp.cc
    const Eigen::Index c0 = Eigen::Index(d.inputs) * k / blocks;
    const Eigen::Index c1 = Eigen::Index(d.inputs) * (k + 1) / blocks;
    g_w1.middleCols(c0, c1 - c0).noalias() = d_hidden * in.middleRows(c0, c1 - c0).transpose();
    ready(2 + static_cast<std::size_t>(k));
  }
  g_b1 = d_hidden.rowwise().sum();
  ready(static_cast<std::size_t>(blocks) + 2);
}

}  // namespace

extern const MlpKernels kKernels;
const MlpKernels kKernels = {MWMS_MLP_LEVEL_NAME, &forward, &backward};

}  // namespace mwms::train::detail::MWMS_MLP_LEVEL
