// mwms::apply_gradient (include/mwms/optimizer.h) against straightforward scalar loops written
// here from TF's kernels (bit for bit, several steps, sizes around the SSE2 loop's 4 lanes),
// against TensorFlow 2.21's own updates (tests/data/ps/tf_optimizer_vectors.json, written by
// scripts/tf_optimizer_vectors.py; no TensorFlow is needed here), and the names, slots and checks
// around it.
#include "mwms/optimizer.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "mwms/errors.h"

namespace {

using mwms::OptimizerKind;
using mwms::OptimizerOptions;
using Floats = std::vector<float>;

std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// Distance in units in the last place between two finite floats (0 for -0 vs +0).
std::int64_t ulp_distance(float a, float b) {
  auto ordered = [](float f) {
    const std::int64_t u = float_bits(f);
    return (u & 0x80000000u) ? 0x80000000ll - u : u;  // monotone over all finite floats
  };
  const std::int64_t d = ordered(a) - ordered(b);
  return d < 0 ? -d : d;
}

// Deterministic values in [-scale, scale] (a small LCG: the same on every platform).
Floats values(std::size_t count, std::uint32_t seed, float scale) {
  Floats out(count);
  std::uint32_t x = seed * 2654435761u + 1;
  for (float& f : out) {
    x = x * 1664525u + 1013904223u;
    f = scale * (static_cast<float>(x >> 8) / 8388608.0f - 1.0f);
  }
  return out;
}

// ---- Reference loops: TF's functors element by element, float32, no caching, no SIMD. ----

void reference_sgd(Floats& var, const Floats& grad, float lr) {
  for (std::size_t i = 0; i < var.size(); ++i) var[i] -= grad[i] * lr;
}

void reference_momentum(Floats& var, Floats& accum, const Floats& grad, float lr, float mu,
                        bool nesterov) {
  for (std::size_t i = 0; i < var.size(); ++i) {
    accum[i] = accum[i] * mu + grad[i];
    if (nesterov) {
      var[i] -= grad[i] * lr + accum[i] * mu * lr;
    } else {
      var[i] -= accum[i] * lr;
    }
  }
}

// TF1 AdamOptimizer's beta power at `step`: a float32 variable initialised to beta and multiplied
// by beta after each step.
float reference_beta_power(float beta, std::int64_t step) {
  float power = beta;
  for (std::int64_t t = 1; t < step; ++t) power *= beta;
  return power;
}

void reference_adam(Floats& var, Floats& m, Floats& v, const Floats& grad,
                    const OptimizerOptions& o, std::int64_t step) {
  const float lr = static_cast<float>(o.learning_rate);
  const float beta1 = static_cast<float>(o.beta1);
  const float beta2 = static_cast<float>(o.beta2);
  const float eps = static_cast<float>(o.epsilon);
  const float alpha = lr * std::sqrt(1.0f - reference_beta_power(beta2, step)) /
                      (1.0f - reference_beta_power(beta1, step));
  for (std::size_t i = 0; i < var.size(); ++i) {
    m[i] += (grad[i] - m[i]) * (1.0f - beta1);
    v[i] += (grad[i] * grad[i] - v[i]) * (1.0f - beta2);
    var[i] -= (m[i] * alpha) / (std::sqrt(v[i]) + eps);
  }
}

// The variable and its slots, for apply_gradient.
struct State {
  Floats var;
  std::vector<Floats> slots;
  std::vector<float*> slot_ptrs;

  State(const Floats& var0, OptimizerKind kind)
      : var(var0), slots(mwms::num_slots(kind), Floats(var0.size(), 0.0f)) {
    for (Floats& s : slots) slot_ptrs.push_back(s.data());
  }
  void apply(const OptimizerOptions& o, const Floats& grad, std::int64_t step) {
    mwms::apply_gradient(o, var.data(), grad.data(), slot_ptrs.data(), var.size(), step);
  }
};

void require_bits(const Floats& got, const Floats& want, const std::string& what) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO(what << "[" << i << "]: got " << std::setprecision(9) << got[i] << ", want " << want[i]);
    REQUIRE(float_bits(got[i]) == float_bits(want[i]));
  }
}

const std::size_t kSizes[] = {1, 3, 4, 5, 8, 17, 1000};

OptimizerOptions momentum_options(bool nesterov) {
  OptimizerOptions o;
  o.kind = OptimizerKind::kMomentum;
  o.learning_rate = 0.05;
  o.momentum = 0.9;
  o.use_nesterov = nesterov;
  return o;
}

OptimizerOptions adam_options(double lr, double beta1, double beta2, double epsilon) {
  OptimizerOptions o;
  o.kind = OptimizerKind::kAdam;
  o.learning_rate = lr;
  o.beta1 = beta1;
  o.beta2 = beta2;
  o.epsilon = epsilon;
  return o;
}

TEST_CASE("optimizer: sgd is var -= grad * lr, bit for bit", "[unit][kernels]") {
  OptimizerOptions o;
  o.kind = OptimizerKind::kSgd;
  o.learning_rate = 0.1;
  for (std::size_t n : kSizes) {
    CAPTURE(n);
    State s(values(n, 1, 1.0f), o.kind);
    Floats want = s.var;
    for (int step = 1; step <= 5; ++step) {
      const Floats grad = values(n, 100 + step, 2.0f);
      s.apply(o, grad, step);
      reference_sgd(want, grad, 0.1f);
      require_bits(s.var, want, "var");
    }
  }
}

TEST_CASE("optimizer: momentum and nesterov match TF's ApplyMomentum, bit for bit",
          "[unit][kernels]") {
  for (bool nesterov : {false, true}) {
    const OptimizerOptions o = momentum_options(nesterov);
    for (std::size_t n : kSizes) {
      CAPTURE(nesterov, n);
      State s(values(n, 2, 1.0f), o.kind);
      Floats want = s.var;
      Floats accum(n, 0.0f);
      for (int step = 1; step <= 6; ++step) {
        const Floats grad = values(n, 200 + step, 2.0f);
        s.apply(o, grad, step);
        reference_momentum(want, accum, grad, 0.05f, 0.9f, nesterov);
        require_bits(s.var, want, "var");
        require_bits(s.slots[0], accum, "momentum");
      }
    }
  }
}

TEST_CASE("optimizer: adam matches TF's ApplyAdam with float32 beta powers, bit for bit",
          "[unit][kernels]") {
  const OptimizerOptions configs[] = {adam_options(0.001, 0.9, 0.999, 1e-8),
                                      adam_options(0.1, 0.8, 0.99, 1e-7),
                                      adam_options(0.01, 0.0, 0.5, 1.0)};
  for (const OptimizerOptions& o : configs) {
    for (std::size_t n : kSizes) {
      CAPTURE(o.learning_rate, o.beta1, o.beta2, n);
      State s(values(n, 3, 1.0f), o.kind);
      Floats want = s.var, m(n, 0.0f), v(n, 0.0f);
      for (int step = 1; step <= 12; ++step) {
        const Floats grad = values(n, 300 + step, 1.0f);
        s.apply(o, grad, step);
        reference_adam(want, m, v, grad, o, step);
        require_bits(s.var, want, "var");
        require_bits(s.slots[0], m, "m");
        require_bits(s.slots[1], v, "v");
      }
    }
  }
}

TEST_CASE("optimizer: adam's beta powers are the same at any step, in any call order",
          "[unit][kernels]") {
  // The per-thread cache resumes from the last step and stops once 1 - beta^t rounds to 1; the
  // result must be the plain running product's at every step, cold or warm, forwards or back.
  const OptimizerOptions o = adam_options(0.001, 0.9, 0.999, 1e-8);
  const OptimizerOptions other = adam_options(0.002, 0.95, 0.9999, 1e-8);
  const std::int64_t steps[] = {1, 2, 3, 170, 171, 500, 17000, 17500, 20000, 40000, 7, 1, 30000};
  const std::size_t n = 9;
  const Floats var0 = values(n, 4, 1.0f), m0 = values(n, 5, 0.1f), grad = values(n, 6, 1.0f);
  Floats v0 = values(n, 7, 0.01f);
  for (float& x : v0) x = std::fabs(x);
  for (std::int64_t step : steps) {
    for (const OptimizerOptions* opt : {&o, &other}) {
      CAPTURE(step, opt->beta2);
      Floats var = var0, m = m0, v = v0;
      Floats want = var0, want_m = m0, want_v = v0;
      float* slots[] = {m.data(), v.data()};
      mwms::apply_gradient(*opt, var.data(), grad.data(), slots, n, step);
      reference_adam(want, want_m, want_v, grad, *opt, step);
      require_bits(var, want, "var");
    }
  }
}

TEST_CASE("optimizer: adam's bias correction makes early steps lr-sized", "[unit][kernels]") {
  // With a constant gradient g from zero slots, m_t = g (1 - beta1^t) and v_t = g^2 (1 - beta2^t),
  // so each update is lr * g / (|g| + epsilon / sqrt(1 - beta2^t)): lr in size, step 1 and step 10
  // alike. Without the correction step 1 would move lr * (1 - beta1) / sqrt(1 - beta2), 3.2 lr.
  const OptimizerOptions o = adam_options(0.001, 0.9, 0.999, 1e-8);
  const float g = 0.25f;
  float var = 1.0f, m = 0.0f, v = 0.0f;
  float* slots[] = {&m, &v};
  for (int step = 1; step <= 10; ++step) {
    const float before = var;
    mwms::apply_gradient(o, &var, &g, slots, 1, step);
    const double moved = static_cast<double>(before) - var;
    const double expect = 0.001 * g / (g + 1e-8 / std::sqrt(1.0 - std::pow(0.999, step)));
    if (step == 1 || step == 10) {
      CAPTURE(step, moved, expect);
      REQUIRE(std::fabs(m - g * (1.0 - std::pow(0.9, step))) <= 1e-6 * g);
      REQUIRE(std::fabs(v - g * g * (1.0 - std::pow(0.999, step))) <= 1e-5 * g * g);
      // var is near 1, where a float32 ulp is 6e-8: the move carries about 1e-4 relative error.
      REQUIRE(moved == Approx(expect).epsilon(2e-3));
    }
  }
}

TEST_CASE("optimizer: count 0 touches nothing but still validates", "[unit][kernels]") {
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kMomentum, OptimizerKind::kAdam}) {
    OptimizerOptions o;
    o.kind = kind;
    CAPTURE(mwms::to_string(kind));
    REQUIRE_NOTHROW(mwms::apply_gradient(o, nullptr, nullptr, nullptr, 0, 1));
    o.learning_rate = -1;
    REQUIRE_THROWS_AS(mwms::apply_gradient(o, nullptr, nullptr, nullptr, 0, 1),
                      mwms::InvalidArgument);
  }
}

TEST_CASE("optimizer: bad buffers and steps throw InvalidArgument and change nothing",
          "[unit][kernels]") {
  OptimizerOptions o = adam_options(0.001, 0.9, 0.999, 1e-8);
  float var = 1.0f, g = 1.0f, m = 0.0f, v = 0.0f;
  float* slots[] = {&m, &v};
  REQUIRE_THROWS_WITH(mwms::apply_gradient(o, &var, &g, slots, 1, 0),
                      Catch::Contains("adam step is 0"));
  REQUIRE_THROWS_AS(mwms::apply_gradient(o, &var, &g, slots, 1, -3), mwms::InvalidArgument);
  REQUIRE_THROWS_WITH(mwms::apply_gradient(o, nullptr, &g, slots, 1, 1),
                      Catch::Contains("null var"));
  REQUIRE_THROWS_WITH(mwms::apply_gradient(o, &var, nullptr, slots, 1, 1),
                      Catch::Contains("null grad"));
  float* one_missing[] = {&m, nullptr};
  REQUIRE_THROWS_WITH(mwms::apply_gradient(o, &var, &g, one_missing, 1, 1),
                      Catch::Contains("slot 'v'"));
  REQUIRE_THROWS_AS(mwms::apply_gradient(o, &var, &g, nullptr, 1, 1), mwms::InvalidArgument);
  REQUIRE(var == 1.0f);
  REQUIRE(m == 0.0f);
  REQUIRE(v == 0.0f);
  // sgd and momentum ignore the step; sgd needs no slots.
  o.kind = OptimizerKind::kSgd;
  REQUIRE_NOTHROW(mwms::apply_gradient(o, &var, &g, nullptr, 1, 0));
  o.kind = OptimizerKind::kMomentum;
  REQUIRE_THROWS_WITH(mwms::apply_gradient(o, &var, &g, nullptr, 1, 0),
                      Catch::Contains("slot 'momentum'"));
  REQUIRE_NOTHROW(mwms::apply_gradient(o, &var, &g, slots, 1, 0));
}

TEST_CASE("optimizer: slot counts and TF's slot names", "[unit][kernels]") {
  REQUIRE(mwms::num_slots(OptimizerKind::kSgd) == 0);
  REQUIRE(mwms::num_slots(OptimizerKind::kMomentum) == 1);
  REQUIRE(mwms::num_slots(OptimizerKind::kAdam) == 2);
  REQUIRE(mwms::slot_name(OptimizerKind::kSgd, 0) == nullptr);
  REQUIRE(std::string(mwms::slot_name(OptimizerKind::kMomentum, 0)) == "momentum");
  REQUIRE(mwms::slot_name(OptimizerKind::kMomentum, 1) == nullptr);
  REQUIRE(std::string(mwms::slot_name(OptimizerKind::kAdam, 0)) == "m");
  REQUIRE(std::string(mwms::slot_name(OptimizerKind::kAdam, 1)) == "v");
  REQUIRE(mwms::slot_name(OptimizerKind::kAdam, 2) == nullptr);
  REQUIRE(mwms::slot_name(OptimizerKind::kAdam, -1) == nullptr);
  const auto bogus = static_cast<OptimizerKind>(7);
  REQUIRE(mwms::num_slots(bogus) == 0);
  REQUIRE(mwms::slot_name(bogus, 0) == nullptr);
  REQUIRE(mwms::to_string(bogus) == "unknown");
}

TEST_CASE("optimizer: names parse and print", "[unit][kernels]") {
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kMomentum, OptimizerKind::kAdam}) {
    REQUIRE(mwms::parse_optimizer(mwms::to_string(kind)) == kind);
  }
  REQUIRE(mwms::to_string(OptimizerKind::kAdam) == "adam");
  REQUIRE_THROWS_AS(mwms::parse_optimizer("Adam"), mwms::InvalidArgument);
  REQUIRE_THROWS_WITH(mwms::parse_optimizer("rmsprop"),
                      Catch::Contains("'rmsprop'") && Catch::Contains("sgd, momentum or adam"));
  REQUIRE_THROWS_AS(mwms::parse_optimizer(""), mwms::InvalidArgument);
}

TEST_CASE("optimizer: validate rejects what TF's update cannot use", "[unit][kernels]") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  struct Bad {
    OptimizerKind kind;
    double OptimizerOptions::*member;
    double value;
    const char* message;
  };
  const Bad bad[] = {
      {OptimizerKind::kSgd, &OptimizerOptions::learning_rate, 0.0, "learning_rate is 0"},
      {OptimizerKind::kSgd, &OptimizerOptions::learning_rate, -0.1, "learning_rate is -0.1"},
      {OptimizerKind::kSgd, &OptimizerOptions::learning_rate, nan, "learning_rate"},
      {OptimizerKind::kAdam, &OptimizerOptions::learning_rate, inf, "learning_rate"},
      {OptimizerKind::kSgd, &OptimizerOptions::learning_rate, 1e300, "finite in float32"},
      {OptimizerKind::kSgd, &OptimizerOptions::learning_rate, 1e-50, "> 0"},
      {OptimizerKind::kMomentum, &OptimizerOptions::momentum, -0.5, "momentum is -0.5"},
      {OptimizerKind::kMomentum, &OptimizerOptions::momentum, nan, "momentum"},
      {OptimizerKind::kAdam, &OptimizerOptions::beta1, 1.0, "beta1 is 1 (must be in [0, 1)"},
      {OptimizerKind::kAdam, &OptimizerOptions::beta1, -0.1, "beta1"},
      {OptimizerKind::kAdam, &OptimizerOptions::beta1, 0.99999999, "in float32"},  // rounds to 1
      {OptimizerKind::kAdam, &OptimizerOptions::beta2, 1.5, "beta2 is 1.5"},
      {OptimizerKind::kAdam, &OptimizerOptions::beta2, nan, "beta2"},
      {OptimizerKind::kAdam, &OptimizerOptions::epsilon, 0.0, "epsilon is 0"},
      {OptimizerKind::kAdam, &OptimizerOptions::epsilon, -1e-8, "epsilon"},
      {OptimizerKind::kAdam, &OptimizerOptions::epsilon, inf, "epsilon"},
  };
  for (const Bad& b : bad) {
    OptimizerOptions o;
    o.kind = b.kind;
    o.*b.member = b.value;
    CAPTURE(mwms::to_string(b.kind), b.value, b.message);
    REQUIRE_THROWS_AS(mwms::validate(o), mwms::InvalidArgument);
    REQUIRE_THROWS_WITH(mwms::validate(o), Catch::Contains(b.message));
  }
  // Members a kind does not use are not checked; the defaults are valid.
  OptimizerOptions o;
  o.momentum = -1;
  o.beta1 = 2;
  o.epsilon = 0;
  REQUIRE_NOTHROW(mwms::validate(o));
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kMomentum, OptimizerKind::kAdam}) {
    OptimizerOptions d;
    d.kind = kind;
    REQUIRE_NOTHROW(mwms::validate(d));
  }
  OptimizerOptions edge = adam_options(0.001, 0.0, 0.0, 1e-8);  // beta 0 is allowed
  REQUIRE_NOTHROW(mwms::validate(edge));
  o.kind = static_cast<OptimizerKind>(9);
  REQUIRE_THROWS_WITH(mwms::validate(o), Catch::Contains("kind 9"));
}

Floats json_floats(const nlohmann::json& array) {
  Floats out;
  for (const auto& x : array) out.push_back(static_cast<float>(x.get<double>()));  // exact
  return out;
}

TEST_CASE("optimizer: TensorFlow 2.21's own updates, bit for bit", "[unit][kernels]") {
  // The vectors hold 5 steps of tf.compat.v1.train's optimizers (ResourceApply* CPU kernels) on a
  // 19-element float32 variable. Our updates follow the same float32 operations in the same
  // order, so they are required to match exactly (Note [optimizer bit identity],
  // src/kernels/optimizer.cc): a tolerance of 0 ulps, since any difference means a changed
  // formula or operation order (computing Adam's alpha in double with pow() is already 1 ulp off
  // at step 1). Only a TF that rounds differently (one built with FMA contraction) could justify
  // a tolerance: then kMaxUlps = 2 per value over 5 steps, after checking that this is the cause.
  const std::string path =
      std::string(MWMS_SOURCE_DIR) + "/tests/data/ps/tf_optimizer_vectors.json";
  std::ifstream in(path);
  REQUIRE(in.good());
  const nlohmann::json doc = nlohmann::json::parse(in);
  constexpr std::int64_t kMaxUlps = 0;
  const auto& cases = doc.at("cases");
  REQUIRE(cases.size() >= 6);
  for (const auto& c : cases) {
    const std::string name = c.at("name");
    CAPTURE(name);
    OptimizerOptions o;
    o.kind = mwms::parse_optimizer(c.at("kind").get<std::string>());
    const auto& opt = c.at("options");
    o.learning_rate = opt.at("learning_rate");
    if (o.kind == OptimizerKind::kMomentum) {
      o.momentum = opt.at("momentum");
      o.use_nesterov = opt.at("use_nesterov");
    } else if (o.kind == OptimizerKind::kAdam) {
      o.beta1 = opt.at("beta1");
      o.beta2 = opt.at("beta2");
      o.epsilon = opt.at("epsilon");
    }
    State s(json_floats(c.at("var0")), o.kind);
    const auto& grads = c.at("grads");
    const auto& steps = c.at("steps");
    REQUIRE(steps.size() == grads.size());
    for (std::size_t t = 0; t < steps.size(); ++t) {
      s.apply(o, json_floats(grads[t]), static_cast<std::int64_t>(t + 1));
      std::vector<std::pair<std::string, Floats>> want = {{"var", json_floats(steps[t].at("var"))}};
      std::vector<const Floats*> got = {&s.var};
      for (int k = 0; k < mwms::num_slots(o.kind); ++k) {
        const char* slot = mwms::slot_name(o.kind, k);
        want.emplace_back(slot, json_floats(steps[t].at("slots").at(slot)));
        got.push_back(&s.slots[k]);
      }
      for (std::size_t j = 0; j < want.size(); ++j) {
        REQUIRE(got[j]->size() == want[j].second.size());
        for (std::size_t i = 0; i < want[j].second.size(); ++i) {
          INFO("step " << t + 1 << " " << want[j].first << "[" << i << "]: got "
                       << std::setprecision(9) << (*got[j])[i] << ", tf " << want[j].second[i]);
          REQUIRE(ulp_distance((*got[j])[i], want[j].second[i]) <= kMaxUlps);
        }
      }
    }
  }
}

}  // namespace
