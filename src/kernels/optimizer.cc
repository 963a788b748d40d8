// Dense optimizer updates (include/mwms/optimizer.h): the element rules of TF's CPU functors
// ApplyGradientDescent, ApplyMomentum and ApplyAdamNonCuda (tensorflow/core/kernels/
// training_ops.cc), written out in float32 in TF's operation order, plus the names and checks
// around them.
//
// Note [optimizer bit identity]: every value is float32 and every operation one IEEE add,
// subtract, multiply, divide or square root, correctly rounded, in the order TF's Eigen
// expressions evaluate them ("var -= grad * lr()" is var - (grad * lr), never var - grad * lr
// fused). The kernels compile with -ffp-contract=off, so no multiply-add is contracted into an
// FMA on any ISA, and the SSE2 loop below does lane for lane what the scalar loop does. The
// results are therefore the same on every x86-64 or other IEEE CPU, and the same as TF's own CPU
// kernels, which the stock tensorflow-cpu wheels build without FMA (the unit test holds 5 steps
// of TF 2.21's updates and finds them equal bit for bit). Scalars come from TF1's Python side:
// hyper-parameters rounded to float32 once (convert_to_tensor), and Adam's beta powers as float32
// running products (Note [adam beta powers]). What is NOT bit-identical: TF's GPU kernels, a TF
// built with FMA, and Keras (TF2) optimizers, which compute Adam's step differently.
#include "mwms/optimizer.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "mwms/errors.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#define MWMS_OPTIMIZER_SSE2 1
#else
#define MWMS_OPTIMIZER_SSE2 0
#endif

namespace mwms {
namespace {

std::string format_value(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.9g", value);
  return text;
}

[[noreturn]] void throw_invalid(const OptimizerOptions& options, const char* member, double value,
                                const char* requirement) {
  throw InvalidArgument("invalid " + std::string(to_string(options.kind)) + " optimizer options: " +
                        member + " is " + format_value(value) + " (must be " + requirement + ")");
}

// The float32 value TF's kernels see for a Python-float hyper-parameter.
float as_float(double value) noexcept { return static_cast<float>(value); }

void sgd(float* __restrict var, const float* __restrict grad, std::size_t count, float lr) {
  for (std::size_t i = 0; i < count; ++i) var[i] = var[i] - grad[i] * lr;
}

void momentum(float* __restrict var, const float* __restrict grad, float* __restrict accum,
              std::size_t count, float lr, float mu, bool nesterov) {
  if (nesterov) {
    for (std::size_t i = 0; i < count; ++i) {
      const float a = accum[i] * mu + grad[i];
      accum[i] = a;
      var[i] = var[i] - (grad[i] * lr + a * mu * lr);
    }
  } else {
    for (std::size_t i = 0; i < count; ++i) {
      const float a = accum[i] * mu + grad[i];
      accum[i] = a;
      var[i] = var[i] - a * lr;
    }
  }
}

// Note [adam beta powers]: TF1's AdamOptimizer keeps beta1_power and beta2_power as float32
// variables that start at beta and are multiplied by beta after every step (adam.py, _finish), so
// step t sees p_1 = beta, p_t = fl(p_{t-1} * beta), which drifts from pow(beta, t) by many ulps
// after a few hundred steps. To match it we run the same product. It is cheap: a per-thread cache
// resumes from the previous call's step (consecutive steps cost one multiply), and the run stops
// once 1 - p rounds to 1 in float32 (only 1 - p is used, and p never grows) or p stops changing
// (a denormal stall), so even a cold start is bounded: about 17,000 multiplies for beta2 = 0.999,
// 170 for beta1 = 0.9.
struct BetaPower {
  std::uint32_t beta_bits = 0;
  std::int64_t step = 0;  // 0: empty
  float power = 0.0f;     // p_step, or a value with the same (saturated) 1 - p
};

float one_minus_beta_power(float beta, std::int64_t step, BetaPower& cache) noexcept {
  std::uint32_t bits;
  std::memcpy(&bits, &beta, sizeof bits);
  std::int64_t t = 1;
  float power = beta;
  if (cache.step >= 1 && cache.step <= step && cache.beta_bits == bits) {
    t = cache.step;
    power = cache.power;
  }
  while (t < step && 1.0f - power != 1.0f) {
    const float next = power * beta;
    if (next == power) break;
    power = next;
    ++t;
  }
  cache = {bits, step, power};
  return 1.0f - power;
}

struct AdamScalars {
  float alpha;            // lr * sqrt(1 - beta2_power) / (1 - beta1_power)
  float one_minus_beta1;  // TF's T(1) - beta1()
  float one_minus_beta2;
  float epsilon;
};

AdamScalars adam_scalars(const OptimizerOptions& options, std::int64_t step) noexcept {
  thread_local BetaPower beta1_cache;
  thread_local BetaPower beta2_cache;
  const float beta1 = as_float(options.beta1);
  const float beta2 = as_float(options.beta2);
  const float one_minus_p1 = one_minus_beta_power(beta1, step, beta1_cache);
  const float one_minus_p2 = one_minus_beta_power(beta2, step, beta2_cache);
  AdamScalars s;
  s.alpha = as_float(options.learning_rate) * std::sqrt(one_minus_p2) / one_minus_p1;
  s.one_minus_beta1 = 1.0f - beta1;
  s.one_minus_beta2 = 1.0f - beta2;
  s.epsilon = as_float(options.epsilon);
  return s;
}

inline void adam_element(float& var, float& m, float& v, float g, const AdamScalars& s) noexcept {
  m = m + (g - m) * s.one_minus_beta1;
  v = v + (g * g - v) * s.one_minus_beta2;
  var = var - (m * s.alpha) / (std::sqrt(v) + s.epsilon);
}

// GCC and Clang do not vectorise std::sqrt without -fno-math-errno (it may set errno), and the
// scalar loop ran 3.7 times slower (9 against 33 GB/s), so x86-64 runs 4 lanes of SSE2, its
// baseline: the same operations in the same order, hence the same bits as adam_element().
void adam(float* __restrict var, const float* __restrict grad, float* __restrict m,
          float* __restrict v, std::size_t count, const AdamScalars& s) noexcept {
  std::size_t i = 0;
#if MWMS_OPTIMIZER_SSE2
  const __m128 alpha = _mm_set1_ps(s.alpha);
  const __m128 c1 = _mm_set1_ps(s.one_minus_beta1);
  const __m128 c2 = _mm_set1_ps(s.one_minus_beta2);
  const __m128 eps = _mm_set1_ps(s.epsilon);
  for (; i + 4 <= count; i += 4) {
    const __m128 g = _mm_loadu_ps(grad + i);
    __m128 mi = _mm_loadu_ps(m + i);
    __m128 vi = _mm_loadu_ps(v + i);
    mi = _mm_add_ps(mi, _mm_mul_ps(_mm_sub_ps(g, mi), c1));
    vi = _mm_add_ps(vi, _mm_mul_ps(_mm_sub_ps(_mm_mul_ps(g, g), vi), c2));
    const __m128 step = _mm_div_ps(_mm_mul_ps(mi, alpha), _mm_add_ps(_mm_sqrt_ps(vi), eps));
    _mm_storeu_ps(m + i, mi);
    _mm_storeu_ps(v + i, vi);
    _mm_storeu_ps(var + i, _mm_sub_ps(_mm_loadu_ps(var + i), step));
  }
#endif
  for (; i < count; ++i) adam_element(var[i], m[i], v[i], grad[i], s);
}

}  // namespace

int num_slots(OptimizerKind kind) noexcept {
  switch (kind) {
    case OptimizerKind::kSgd:
      return 0;
    case OptimizerKind::kMomentum:
      return 1;
    case OptimizerKind::kAdam:
      return 2;
  }
  return 0;
}

const char* slot_name(OptimizerKind kind, int slot) noexcept {
  if (slot < 0 || slot >= num_slots(kind)) return nullptr;
  if (kind == OptimizerKind::kMomentum) return "momentum";
  return slot == 0 ? "m" : "v";
}

std::string_view to_string(OptimizerKind kind) noexcept {
  switch (kind) {
    case OptimizerKind::kSgd:
      return "sgd";
    case OptimizerKind::kMomentum:
      return "momentum";
    case OptimizerKind::kAdam:
      return "adam";
  }
  return "unknown";
}

OptimizerKind parse_optimizer(std::string_view name) {
  if (name == "sgd") return OptimizerKind::kSgd;
  if (name == "momentum") return OptimizerKind::kMomentum;
  if (name == "adam") return OptimizerKind::kAdam;
  throw InvalidArgument("unknown optimizer '" + std::string(name) +
                        "' (expected sgd, momentum or adam)");
}

void validate(const OptimizerOptions& options) {
  if (to_string(options.kind) == "unknown") {
    throw InvalidArgument("invalid optimizer options: kind " +
                          std::to_string(static_cast<int>(options.kind)) +
                          " is not an OptimizerKind (sgd, momentum or adam)");
  }
  const float lr = as_float(options.learning_rate);
  if (!(lr > 0.0f) || !std::isfinite(lr)) {
    throw_invalid(options, "learning_rate", options.learning_rate, "> 0 and finite in float32");
  }
  if (options.kind == OptimizerKind::kMomentum) {
    const float mu = as_float(options.momentum);
    if (!(mu >= 0.0f) || !std::isfinite(mu)) {
      throw_invalid(options, "momentum", options.momentum, ">= 0 and finite in float32");
    }
  }
  if (options.kind == OptimizerKind::kAdam) {
    // As float32: a beta just below 1 in double may round to 1, where 1 - beta1_power is 0.
    const float beta1 = as_float(options.beta1);
    const float beta2 = as_float(options.beta2);
    const float eps = as_float(options.epsilon);
    if (!(beta1 >= 0.0f && beta1 < 1.0f)) {
      throw_invalid(options, "beta1", options.beta1, "in [0, 1) in float32");
    }
    if (!(beta2 >= 0.0f && beta2 < 1.0f)) {
      throw_invalid(options, "beta2", options.beta2, "in [0, 1) in float32");
    }
    if (!(eps > 0.0f) || !std::isfinite(eps)) {
      throw_invalid(options, "epsilon", options.epsilon, "> 0 and finite in float32");
    }
  }
}

void apply_gradient(const OptimizerOptions& options, float* var, const float* grad,
                    float* const* slots, std::size_t count, std::int64_t step) {
  validate(options);
  const int slot_count = num_slots(options.kind);
  if (options.kind == OptimizerKind::kAdam && step < 1) {
    throw InvalidArgument("apply_gradient: adam step is " + std::to_string(step) +
                          " (must be >= 1: the first update is step 1)");
  }
  if (count == 0) return;
  if (var == nullptr || grad == nullptr) {
    throw InvalidArgument("apply_gradient: null " + std::string(var == nullptr ? "var" : "grad") +
                          " for " + std::to_string(count) + " elements");
  }
  for (int i = 0; i < slot_count; ++i) {
    if (slots == nullptr || slots[i] == nullptr) {
      throw InvalidArgument("apply_gradient: " + std::string(to_string(options.kind)) +
                            " needs slot '" + slot_name(options.kind, i) + "', got nullptr");
    }
  }
  const float lr = as_float(options.learning_rate);
  switch (options.kind) {
    case OptimizerKind::kSgd:
      sgd(var, grad, count, lr);
      return;
    case OptimizerKind::kMomentum:
      momentum(var, grad, slots[0], count, lr, as_float(options.momentum), options.use_nesterov);
      return;
    case OptimizerKind::kAdam:
      adam(var, grad, slots[0], slots[1], count, adam_scalars(options, step));
      return;
  }
}

}  // namespace mwms
