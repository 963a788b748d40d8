// The host-side half of the train example's GPU models, without a GPU: the `__host__ __device__`
// operations and index maps of examples/train/gpu_ops.h against the CPU models they must equal,
// the GPU CNN's whole NCHW dataflow (KCRS kernel, NCHW conv/ReLU/pool, the Flatten map, and back)
// emulated on the host with those maps against Cnn::forward_backward, and the shared init
// (Model::init, glorot_uniform_init) against the per-model init it replaced.
#include "gpu_ops.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "cnn.h"
#include "mlp.h"
#include "model.h"
#include "rng.h"

namespace {

namespace ops = mwms::train::gpu_ops;
using mwms::train::Cnn;
using mwms::train::CnnShape;
using mwms::train::FloatBuffer;
using mwms::train::Mlp;
using mwms::train::MlpShape;

std::vector<float> uniform(std::size_t n, std::uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// The max over every tensor of |a - b|, relative to the largest |b| (1e-30 at least).
double relative_error(const float* a, const float* b, std::size_t n) {
  double diff = 0, scale = 1e-30;
  for (std::size_t i = 0; i < n; ++i) {
    diff = std::max(diff, std::fabs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::fabs(double(b[i])));
  }
  return diff / scale;
}

}  // namespace

TEST_CASE("gpu ops: the kernel map sends CPU (filter, tap) to cuDNN's KCRS f * taps + t",
          "[train][gpu]") {
  for (int filters : {1, 3, 32}) {
    std::set<std::size_t> seen;
    for (std::size_t i = 0; i < std::size_t(filters) * 9; ++i) {
      const std::size_t tap = i / filters, f = i % filters;  // CPU: filters x 9, column-major
      const std::size_t k = ops::kernel_kcrs_index(i, filters, 9);
      CHECK(k == f * 9 + tap);
      seen.insert(k);
    }
    CHECK(seen.size() == std::size_t(filters) * 9);  // a bijection onto [0, 9 filters)
    CHECK(*seen.rbegin() == std::size_t(filters) * 9 - 1);
  }
}

TEST_CASE("gpu ops: the pooled map sends NCHW (b, c, y, x) to Flatten's (y, x, c) column b",
          "[train][gpu]") {
  const int batch = 3, filters = 4, side = 5;
  const std::size_t features = std::size_t(filters) * side * side;
  std::set<std::size_t> seen;
  for (int b = 0; b < batch; ++b) {
    for (int c = 0; c < filters; ++c) {
      for (int y = 0; y < side; ++y) {
        for (int x = 0; x < side; ++x) {
          const std::size_t nchw = ((std::size_t(b) * filters + c) * side + y) * side + x;
          const std::size_t to = ops::pooled_nhwc_index(nchw, filters, side);
          CHECK(to == b * features + (std::size_t(y) * side + x) * filters + c);
          seen.insert(to);
        }
      }
    }
  }
  CHECK(seen.size() == batch * features);
  CHECK(*seen.rbegin() == batch * features - 1);
}

TEST_CASE("gpu ops: softmax cross-entropy and arg-max per column equal the CPU models' bit for bit",
          "[train][gpu]") {
  const int classes = 10, batch = 37;
  std::vector<float> logits = uniform(std::size_t(classes) * batch, 5, -30.0f, 30.0f);
  logits[3 * classes + 4] = logits[3 * classes + 7] = 100.0f;  // a tie: the first wins
  std::vector<std::uint8_t> labels(batch);
  for (int j = 0; j < batch; ++j) labels[j] = static_cast<std::uint8_t>((j * 7) % classes);
  labels[3] = 7;
  std::size_t correct = 0;
  for (int j = 0; j < batch; ++j) {
    correct += ops::argmax_column(logits.data() + j * classes, classes) == labels[j] ? 1 : 0;
  }
  CHECK(correct == mwms::train::count_argmax_correct(logits.data(), labels.data(), batch, classes));
  CHECK(ops::argmax_column(logits.data() + 3 * classes, classes) == 4);

  std::vector<float> cpu = logits, gpu = logits;
  const float scale = 1.0f / 64;
  const double cpu_loss =
      mwms::train::softmax_cross_entropy(cpu.data(), labels.data(), batch, classes, scale);
  double gpu_loss = 0;
  for (int j = 0; j < batch; ++j) {
    gpu_loss += ops::softmax_xent_column(gpu.data() + j * classes, labels[j], classes, scale);
  }
  CHECK(gpu_loss == cpu_loss);
  CHECK(gpu == cpu);
  CHECK(cpu_loss > 0);
}

TEST_CASE("gpu ops: SGD-momentum, bias + ReLU and ReLU's backward pass equal the CPU's",
          "[train][gpu]") {
  const std::size_t n = 1001;
  const std::vector<float> g = uniform(n, 1, -1.0f, 1.0f);
  FloatBuffer p_cpu(n), g_cpu(g.begin(), g.end());
  const std::vector<float> p0 = uniform(n, 2, -1.0f, 1.0f);
  std::copy(p0.begin(), p0.end(), p_cpu.begin());
  std::vector<float> p_gpu = p0, v_gpu(n, 0.0f);
  mwms::train::SgdMomentum sgd(n, 0.05f, 0.9f);
  for (int step = 0; step < 3; ++step) {  // the velocity matters from step 2 on
    sgd.step(p_cpu, g_cpu);
    for (std::size_t i = 0; i < n; ++i) ops::sgd_momentum(p_gpu[i], v_gpu[i], g[i], 0.05f, 0.9f);
  }
  CHECK(std::equal(p_gpu.begin(), p_gpu.end(), p_cpu.begin()));
  CHECK(std::equal(v_gpu.begin(), v_gpu.end(), sgd.velocity().begin()));
  CHECK(p_gpu != p0);

  CHECK(ops::bias_activation(1.5f, -2.0f, true) == 0.0f);
  CHECK(ops::bias_activation(1.5f, -2.0f, false) == -0.5f);
  CHECK(ops::bias_activation(1.5f, 0.25f, true) == 1.75f);
  CHECK(ops::relu_backward(3.0f, 0.0f) == 0.0f);  // inactive at exactly 0, as on the CPU
  CHECK(ops::relu_backward(3.0f, 1e-30f) == 3.0f);
}

// The GPU CNN's dataflow (gpu_model.cu: KCRS kernel, NCHW convolution + bias + ReLU, NCHW max-pool,
// the Flatten map to the dense layers, then back through the same maps to the conv kernel's
// gradient in the CPU layout), written loop by loop with gpu_ops.h: it must give the CPU CNN's
// loss and its conv2d and dense_1 gradients. A wrong index map fails here without a GPU.
TEST_CASE("gpu ops: the GPU CNN's NCHW dataflow through the maps equals the CPU CNN",
          "[train][gpu]") {
  const CnnShape s{8, 3, 5, 4};
  Cnn cnn(s);
  cnn.init(11);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : cnn.params()) v += 0.1f * normal(rng);  // non-zero biases: ReLUs both ways
  const int batch = 3, F = s.filters, cs = s.side - 2, ps = cs / 2, feat = cnn.features();
  const int D = s.dense, C = s.classes;
  const std::vector<float> x = uniform(std::size_t(batch) * s.side * s.side, 9, 0.0f, 1.0f);
  const std::vector<std::uint8_t> y = {1, 3, 0};
  const float scale = 1.0f / batch;
  const double cpu_loss = cnn.forward_backward(x.data(), y.data(), batch, scale, {}, 1);
  const std::vector<float> cpu_grad(cnn.gradients().begin(), cnn.gradients().end());
  const float* p = cnn.params().data();
  const auto& slot = cnn.slots();

  // Forward, as the device runs it.
  std::vector<float> w_kcrs(F * 9);
  for (std::size_t i = 0; i < w_kcrs.size(); ++i) {
    w_kcrs[ops::kernel_kcrs_index(i, F, 9)] = p[slot[0].offset + i];
  }
  const auto nchw = [&](int b, int c, int yy, int xx, int side) {
    return ((std::size_t(b) * F + c) * side + yy) * side + xx;
  };
  std::vector<float> conv_pre(std::size_t(batch) * F * cs * cs), conv(conv_pre.size());
  for (int b = 0; b < batch; ++b)
    for (int f = 0; f < F; ++f)
      for (int oy = 0; oy < cs; ++oy)
        for (int ox = 0; ox < cs; ++ox) {
          float v = 0;
          for (int t = 0; t < 9; ++t) {
            v += w_kcrs[f * 9 + t] * x[(std::size_t(b) * s.side + oy + t / 3) * s.side + ox + t % 3];
          }
          v += p[slot[1].offset + f];
          conv_pre[nchw(b, f, oy, ox, cs)] = v;
          conv[nchw(b, f, oy, ox, cs)] = std::max(v, 0.0f);
        }
  std::vector<float> pooled(std::size_t(batch) * feat), features(pooled.size());
  std::vector<std::size_t> argmax(pooled.size());
  for (int b = 0; b < batch; ++b)
    for (int f = 0; f < F; ++f)
      for (int py = 0; py < ps; ++py)
        for (int px = 0; px < ps; ++px) {
          std::size_t best = nchw(b, f, 2 * py, 2 * px, cs);
          for (int w = 1; w < 4; ++w) {
            const std::size_t at = nchw(b, f, 2 * py + w / 2, 2 * px + w % 2, cs);
            if (conv[at] > conv[best]) best = at;
          }
          pooled[nchw(b, f, py, px, ps)] = conv[best];
          argmax[nchw(b, f, py, px, ps)] = best;
        }
  for (std::size_t i = 0; i < pooled.size(); ++i) {
    features[ops::pooled_nhwc_index(i, F, ps)] = pooled[i];
  }
  const float* w1 = p + slot[2].offset;  // D x feat, column-major
  const float* w2 = p + slot[4].offset;  // C x D
  std::vector<float> hidden(std::size_t(D) * batch), logits(std::size_t(C) * batch);
  for (int b = 0; b < batch; ++b) {
    for (int h = 0; h < D; ++h) {
      float v = 0;
      for (int i = 0; i < feat; ++i) v += w1[h + std::size_t(D) * i] * features[b * feat + i];
      hidden[b * D + h] = ops::bias_activation(v, p[slot[3].offset + h], true);
    }
    for (int c = 0; c < C; ++c) {
      float v = 0;
      for (int h = 0; h < D; ++h) v += w2[c + std::size_t(C) * h] * hidden[b * D + h];
      logits[b * C + c] = ops::bias_activation(v, p[slot[5].offset + c], false);
    }
  }
  double loss = 0;
  for (int b = 0; b < batch; ++b) {
    loss += ops::softmax_xent_column(logits.data() + b * C, y[b], C, scale);
  }
  CHECK(loss == Approx(cpu_loss).epsilon(1e-5));

  // Backward: d_hidden, dense_1's kernel gradient, d_features back to NCHW, the pool, the ReLU,
  // the KCRS filter gradient scattered into the CPU layout, and the conv bias.
  std::vector<float> d_hidden(hidden.size());
  for (int b = 0; b < batch; ++b)
    for (int h = 0; h < D; ++h) {
      float v = 0;
      for (int c = 0; c < C; ++c) v += w2[c + std::size_t(C) * h] * logits[b * C + c];
      d_hidden[b * D + h] = ops::relu_backward(v, hidden[b * D + h]);
    }
  std::vector<float> d_w1(std::size_t(D) * feat, 0.0f), d_features(features.size());
  for (int b = 0; b < batch; ++b)
    for (int i = 0; i < feat; ++i) {
      float v = 0;
      for (int h = 0; h < D; ++h) {
        d_w1[h + std::size_t(D) * i] += d_hidden[b * D + h] * features[b * feat + i];
        v += w1[h + std::size_t(D) * i] * d_hidden[b * D + h];
      }
      d_features[b * feat + i] = v;
    }
  std::vector<float> d_conv(conv.size(), 0.0f);
  for (std::size_t i = 0; i < pooled.size(); ++i) {
    const std::size_t at = argmax[i];
    if (conv_pre[at] > 0.0f) d_conv[at] = d_features[ops::pooled_nhwc_index(i, F, ps)];
  }
  std::vector<float> dw_kcrs(F * 9, 0.0f), d_bias(F, 0.0f);
  for (int b = 0; b < batch; ++b)
    for (int f = 0; f < F; ++f)
      for (int oy = 0; oy < cs; ++oy)
        for (int ox = 0; ox < cs; ++ox) {
          const float d = d_conv[nchw(b, f, oy, ox, cs)];
          d_bias[f] += d;
          for (int t = 0; t < 9; ++t) {
            dw_kcrs[f * 9 + t] +=
                d * x[(std::size_t(b) * s.side + oy + t / 3) * s.side + ox + t % 3];
          }
        }
  std::vector<float> d_kernel(F * 9);
  for (std::size_t i = 0; i < d_kernel.size(); ++i) {
    d_kernel[i] = dw_kcrs[ops::kernel_kcrs_index(i, F, 9)];
  }
  CHECK(relative_error(d_kernel.data(), cpu_grad.data() + slot[0].offset, slot[0].count) < 1e-5);
  CHECK(relative_error(d_bias.data(), cpu_grad.data() + slot[1].offset, slot[1].count) < 1e-5);
  CHECK(relative_error(d_w1.data(), cpu_grad.data() + slot[2].offset, slot[2].count) < 1e-5);
  CHECK(*std::max_element(d_kernel.begin(), d_kernel.end()) > 0);  // not all zero
}

// The init the models had before it moved into Model (Note [model layout]): one generator, the
// kernels in layer order, biases zero. Model::init must reproduce it bit for bit.
TEST_CASE("model init: Model::init and glorot_uniform_init reproduce the per-model Glorot init",
          "[train][gpu]") {
  const auto old_init = [](const mwms::train::Model& m, std::uint64_t seed,
                           const std::vector<std::vector<int>>& fans) {
    std::vector<float> params(m.params().size(), 0.0f);
    std::mt19937_64 rng(mwms::train::mix_seed(seed, mwms::train::kInitStream));
    for (const auto& f : fans) {
      const float bound = std::sqrt(6.0f / static_cast<float>(f[1] + f[2]));
      const auto& slot = m.slots()[f[0]];
      for (std::size_t i = 0; i < slot.count; ++i) {
        params[slot.offset + i] = mwms::train::uniform_symmetric(rng, bound);
      }
    }
    return params;
  };
  Mlp mlp(MlpShape{784, 256, 10});
  mlp.init(42);
  CHECK(std::equal(mlp.params().begin(), mlp.params().end(),
                   old_init(mlp, 42, {{0, 784, 256}, {2, 256, 10}}).begin()));
  Cnn cnn(CnnShape{28, 32, 64, 10});
  cnn.init(42);
  CHECK(std::equal(cnn.params().begin(), cnn.params().end(),
                   old_init(cnn, 42, {{0, 9, 9 * 32}, {2, 5408, 64}, {4, 64, 10}}).begin()));
  CHECK(cnn.slots().size() == 6);
  CHECK(cnn.slots()[5].offset + cnn.slots()[5].count == 347146);  // the tutorial's count
  // Any buffer with the layout gets the same values (what the GPU model copies to the device).
  std::vector<float> host(cnn.params().size(), 1.0f);
  mwms::train::glorot_uniform_init(42, cnn.slots(), cnn.glorot_fans(), host.data(), host.size());
  CHECK(std::equal(host.begin(), host.end(), cnn.params().begin()));
  CHECK_THROWS_AS(mwms::train::glorot_uniform_init(42, cnn.slots(), cnn.glorot_fans(),
                                                   host.data(), host.size() - 1),
                  std::invalid_argument);
}
