// The MLP kernels of every ISA level this CPU runs (examples/train/mlp_kernels.h, Note [train cpu
// dispatch]) against plain loops in double precision: forward activations and every gradient,
// the ready() pieces in backprop order, and the level mlp_kernels() chooses.
#include "mlp_kernels.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

using mwms::train::detail::MlpBackwardArgs;
using mwms::train::detail::MlpDims;
using mwms::train::detail::MlpForwardArgs;
using mwms::train::detail::MlpKernels;

std::vector<float> uniform(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

struct Reference {  // double-precision loops, the layout of Note [flat parameters]
  std::vector<double> hidden, logits, grads;
};

Reference reference(const MlpDims& d, const std::vector<float>& p, const std::vector<float>& x,
                    const std::vector<float>& d_logits, int batch) {
  const std::size_t I = d.inputs, H = d.hidden, C = d.classes;
  const std::size_t b1 = H * I, w2 = H * (I + 1), b2 = w2 + C * H;
  Reference r;
  r.hidden.assign(H * batch, 0.0);
  r.logits.assign(C * batch, 0.0);
  r.grads.assign(b2 + C, 0.0);
  for (int n = 0; n < batch; ++n) {
    for (std::size_t h = 0; h < H; ++h) {
      double s = p[b1 + h];
      for (std::size_t i = 0; i < I; ++i) s += double(p[i * H + h]) * x[n * I + i];
      r.hidden[n * H + h] = std::max(s, 0.0);
    }
    for (std::size_t c = 0; c < C; ++c) {
      double s = p[b2 + c];
      for (std::size_t h = 0; h < H; ++h) s += double(p[w2 + h * C + c]) * r.hidden[n * H + h];
      r.logits[n * C + c] = s;
    }
  }
  for (int n = 0; n < batch; ++n) {
    for (std::size_t c = 0; c < C; ++c) {
      const double g = d_logits[n * C + c];
      r.grads[b2 + c] += g;
      for (std::size_t h = 0; h < H; ++h) r.grads[w2 + h * C + c] += g * r.hidden[n * H + h];
    }
    for (std::size_t h = 0; h < H; ++h) {
      if (r.hidden[n * H + h] <= 0.0) continue;
      double dh = 0.0;
      for (std::size_t c = 0; c < C; ++c) dh += double(p[w2 + h * C + c]) * d_logits[n * C + c];
      r.grads[b1 + h] += dh;
      for (std::size_t i = 0; i < I; ++i) r.grads[i * H + h] += dh * x[n * I + i];
    }
  }
  return r;
}

template <typename A, typename B>
double max_error(const A& got, const B& want) {
  double worst = 0.0, scale = 1e-30;
  for (std::size_t i = 0; i < want.size(); ++i) {
    worst = std::max(worst, std::abs(double(got[i]) - double(want[i])));
    scale = std::max(scale, std::abs(double(want[i])));
  }
  return worst / scale;
}

}  // namespace

TEST_CASE("train MLP kernels: every ISA level equals plain loops", "[unit][train]") {
  const MlpKernels* levels[3] = {};
  const std::size_t n = mwms::train::detail::mlp_kernel_levels(levels, 3);
  REQUIRE(n >= 1);
  CHECK(std::string(levels[0]->isa) == "x86-64");
  // The chosen level is the widest this CPU runs.
  CHECK(&mwms::train::detail::mlp_kernels() == levels[n - 1]);
  const MlpDims d{37, 19, 5};  // odd sizes: no level may assume whole vectors
  const int batch = 7;
  const std::size_t count = std::size_t(d.hidden) * (d.inputs + 1) + d.classes * (d.hidden + 1);
  const auto p = uniform(count, 1), x = uniform(std::size_t(d.inputs) * batch, 2);
  const auto d_logits = uniform(std::size_t(d.classes) * batch, 3);
  const Reference want = reference(d, p, x, d_logits, batch);
  for (std::size_t l = 0; l < n; ++l) {
    CAPTURE(levels[l]->isa);
    std::vector<float> hidden(want.hidden.size()), logits(want.logits.size());
    MlpForwardArgs f;
    f.params = p.data();
    f.dims = d;
    f.x = x.data();
    f.batch = batch;
    f.hidden = hidden.data();
    f.logits = logits.data();
    levels[l]->forward(f);
    CHECK(max_error(hidden, want.hidden) < 1e-5);
    CHECK(max_error(logits, want.logits) < 1e-5);
    for (const int blocks : {1, 3}) {
      CAPTURE(blocks);
      std::vector<float> grads(count, 7.0f), d_hidden(hidden.size());
      std::vector<std::size_t> pieces;
      MlpBackwardArgs b;
      b.params = p.data();
      b.grads = grads.data();
      b.dims = d;
      b.x = x.data();
      b.batch = batch;
      b.hidden = hidden.data();
      b.d_logits = d_logits.data();
      b.d_hidden = d_hidden.data();
      b.ready = [](const void* ctx, std::size_t piece) {
        static_cast<std::vector<std::size_t>*>(const_cast<void*>(ctx))->push_back(piece);
      };
      b.ctx = &pieces;
      b.w1_blocks = blocks;
      levels[l]->backward(b);
      CHECK(max_error(grads, want.grads) < 1e-5);
      std::vector<std::size_t> order(blocks + 3);
      for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
      CHECK(pieces == order);
    }
  }
}
