// The train example's CNN (examples/train/cnn.h) on a small shape: its loss against a direct
// (loop-by-loop, no im2col) reference of the same network, and its gradient against central
// finite differences of that loss for every parameter.
#include "cnn.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace {

using mwms::train::Cnn;
using mwms::train::CnnShape;

// Conv 3x3 valid + ReLU, max-pool 2, dense + ReLU, dense, softmax cross-entropy, summed over the
// batch: written from the definitions, in double, with the CNN's parameter layout (kernel
// (filter, tap) column-major, features in (row, column, channel) order).
double reference_loss(const Cnn& cnn, const std::vector<float>& x,
                      const std::vector<std::uint8_t>& y) {
  const CnnShape s = cnn.shape();
  const int cs = s.side - 2, ps = cs / 2, feat = cnn.features();
  const auto& p = cnn.params();
  const auto& slots = cnn.slots();
  const auto at = [&](int slot, std::size_t i) {
    return static_cast<double>(p[slots[slot].offset + i]);
  };
  double total = 0;
  for (std::size_t b = 0; b < y.size(); ++b) {
    const float* image = x.data() + b * s.side * s.side;
    std::vector<double> features(feat);
    for (int f = 0; f < s.filters; ++f) {
      for (int py = 0; py < ps; ++py) {
        for (int px = 0; px < ps; ++px) {
          double best = -1e30;
          for (int dy = 0; dy < 2; ++dy) {
            for (int dx = 0; dx < 2; ++dx) {
              const int oy = 2 * py + dy, ox = 2 * px + dx;
              double v = at(1, f);
              for (int ky = 0; ky < 3; ++ky) {
                for (int kx = 0; kx < 3; ++kx) {
                  v += at(0, f + s.filters * (ky * 3 + kx)) * image[(oy + ky) * s.side + ox + kx];
                }
              }
              best = std::max(best, std::max(v, 0.0));
            }
          }
          features[(py * ps + px) * s.filters + f] = best;
        }
      }
    }
    std::vector<double> hidden(s.dense), logits(s.classes);
    for (int h = 0; h < s.dense; ++h) {
      double v = at(3, h);
      for (int i = 0; i < feat; ++i) v += at(2, h + std::size_t(s.dense) * i) * features[i];
      hidden[h] = std::max(v, 0.0);
    }
    for (int c = 0; c < s.classes; ++c) {
      double v = at(5, c);
      for (int h = 0; h < s.dense; ++h) v += at(4, c + std::size_t(s.classes) * h) * hidden[h];
      logits[c] = v;
    }
    const double zmax = *std::max_element(logits.begin(), logits.end());
    double sum = 0;
    for (double z : logits) sum += std::exp(z - zmax);
    total += std::log(sum) - (logits[y[b]] - zmax);
  }
  return total;
}

}  // namespace

TEST_CASE("cnn: loss matches a direct reference and the gradient matches finite differences",
          "[unit][train]") {
  Cnn cnn(CnnShape{8, 3, 5, 4});  // 8x8 images: conv 6x6x3, pool 3x3x3 = 27 features
  REQUIRE(cnn.features() == 27);
  REQUIRE(cnn.params().size() == 3 * 9 + 3 + 5 * 27 + 5 + 4 * 5 + 4);
  cnn.init(7);
  std::mt19937_64 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : cnn.params()) v += 0.1f * normal(rng);  // non-zero biases: ReLUs both ways
  const int batch = 3;
  std::vector<float> x(std::size_t(batch) * 64);
  for (float& v : x) v = normal(rng);
  const std::vector<std::uint8_t> y = {0, 3, 1};

  std::vector<std::size_t> order;
  const double loss = cnn.forward_backward(
      x.data(), y.data(), batch, 1.0f, [&](std::size_t i) { order.push_back(i); }, 1);
  CHECK(order == std::vector<std::size_t>{0, 1, 2, 3, 4, 5});
  CHECK(loss == Approx(reference_loss(cnn, x, y)).epsilon(1e-5));
  const std::vector<float> grads(cnn.gradients().begin(), cnn.gradients().end());
  CHECK(cnn.count_correct(x.data(), y.data(), batch) <= std::size_t(batch));

  // Central differences of the reference loss (double), so only the perturbation's size limits
  // them: h = 1e-3 gives errors ~h^2, far below the tolerance, unless a ReLU or a pool's maximum
  // switches inside [-h, h] (none does with these seeds).
  const double h = 1e-3;
  int mismatches = 0;
  for (std::size_t i = 0; i < cnn.params().size(); ++i) {
    const float saved = cnn.params()[i];
    const float hi = saved + static_cast<float>(h), lo = saved - static_cast<float>(h);
    cnn.params()[i] = hi;
    const double up = reference_loss(cnn, x, y);
    cnn.params()[i] = lo;
    const double down = reference_loss(cnn, x, y);
    cnn.params()[i] = saved;
    const double numeric = (up - down) / (static_cast<double>(hi) - lo);
    if (std::fabs(numeric - grads[i]) > 2e-3 + 1e-2 * std::fabs(numeric)) {
      ++mismatches;
      UNSCOPED_INFO("parameter " << i << ": analytic " << grads[i] << ", numeric " << numeric);
    }
  }
  CHECK(mismatches == 0);

  // grad_scale scales the gradient; a batch of 0 gives zeros.
  cnn.forward_backward(x.data(), y.data(), batch, 0.5f, {}, 1);
  for (std::size_t i = 0; i < grads.size(); ++i)
    CHECK(cnn.gradients()[i] == Approx(0.5f * grads[i]));
  cnn.forward_backward(x.data(), y.data(), 0, 1.0f, {}, 1);
  CHECK(
      std::all_of(cnn.gradients().begin(), cnn.gradients().end(), [](float g) { return g == 0; }));
  CHECK_THROWS_AS(cnn.backprop_order(2), std::invalid_argument);
}
