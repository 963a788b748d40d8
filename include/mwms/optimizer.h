/// @file optimizer.h
/// Dense optimizer updates (SGD, momentum, Adam) with their slots, as TensorFlow 1's
/// tf.compat.v1.train optimizers apply them: one function over the caller's float32 buffers, used
/// by the parameter servers and by the `train` program's all-reduce mode alike, so both modes
/// compute the same bits for the same gradients.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "mwms/api.h"

namespace mwms {

/// Which update rule apply_gradient() runs; each names the tf.compat.v1.train optimizer whose
/// kernel it follows (tensorflow/core/kernels/training_ops.cc).
enum class OptimizerKind : std::uint8_t {
  kSgd = 0,       ///< GradientDescentOptimizer (ApplyGradientDescent); no slots
  kMomentum = 1,  ///< MomentumOptimizer (ApplyMomentum); slot "momentum"
  kAdam = 2,      ///< AdamOptimizer (ApplyAdam); slots "m" and "v"
};

/// Hyper-parameters in TF's vocabulary: tf.compat.v1.train.GradientDescentOptimizer(
/// learning_rate), MomentumOptimizer(learning_rate, momentum, use_nesterov), AdamOptimizer(
/// learning_rate, beta1, beta2, epsilon). Held as double like the Python floats TF is given; the
/// update rounds each to float32 once, as TF converts them to float32 tensors (validate() checks
/// the rounded values). Members another kind does not use are ignored.
struct MWMS_API OptimizerOptions {
  OptimizerKind kind = OptimizerKind::kSgd;  ///< the update rule
  double learning_rate = 0.01;               ///< every kind: step size, > 0 and finite
  double momentum = 0.9;      ///< kMomentum: decay of the accumulator, >= 0 and finite
  bool use_nesterov = false;  ///< kMomentum: Nesterov's variant (TF's use_nesterov)
  double beta1 = 0.9;         ///< kAdam: decay of the first moment "m", in [0, 1)
  double beta2 = 0.999;       ///< kAdam: decay of the second moment "v", in [0, 1)
  double epsilon = 1e-8;      ///< kAdam: TF1's "epsilon hat" (added to sqrt(v), not to v), > 0
};

/// Number of slot buffers `kind` keeps per variable: 0 (kSgd), 1 (kMomentum), 2 (kAdam); 0 for a
/// value outside the enum. Never throws.
MWMS_API int num_slots(OptimizerKind kind) noexcept;

/// TF's name of slot `slot` (0-based, < num_slots(kind)), as Optimizer.get_slot() takes it:
/// "momentum" for kMomentum; "m" (first moment) and "v" (second moment) for kAdam. The string is
/// static. nullptr for a slot or kind out of range. Never throws.
MWMS_API const char* slot_name(OptimizerKind kind, int slot) noexcept;

/// Lower-case name of `kind`: "sgd", "momentum", "adam" (what parse_optimizer() reads); "unknown"
/// for a value outside the enum. Never throws.
MWMS_API std::string_view to_string(OptimizerKind kind) noexcept;

/// Parses "sgd", "momentum" or "adam" (exactly; case matters).
/// @throws mwms::InvalidArgument naming the value and the allowed ones otherwise.
MWMS_API OptimizerKind parse_optimizer(std::string_view name);

/// Checks the members `options.kind` uses, after rounding them to float32 as the update does:
/// learning_rate > 0 and finite (every kind); kMomentum: momentum >= 0 and finite; kAdam: beta1
/// and beta2 in [0, 1), epsilon > 0 and finite; and `kind` inside the enum. NaN fails every check.
/// @throws mwms::InvalidArgument naming the member and its value.
MWMS_API void validate(const OptimizerOptions& options);

/// One dense update of `count` float32 elements in place, as TF's CPU kernels ApplyGradientDescent,
/// ApplyMomentum and ApplyAdam do it (tensorflow/core/kernels/training_ops.cc, use_locking=false),
/// with the hyper-parameters rounded to float32 and every operation in float32, in TF's order:
///   - kSgd:      var = var - grad * lr
///   - kMomentum: accum = accum * momentum + grad; then var = var - accum * lr, or with
///                use_nesterov var = var - (grad * lr + accum * momentum * lr)
///   - kAdam:     alpha = lr * sqrt(1 - beta2_power) / (1 - beta1_power); m = m + (grad - m) *
///                (1 - beta1); v = v + (grad * grad - v) * (1 - beta2); var = var - m * alpha /
///                (sqrt(v) + epsilon)
/// beta1_power and beta2_power are beta^step as TF1's AdamOptimizer holds them: float32
/// variables that start at beta and are multiplied by beta (in float32) after each step
/// (tensorflow/python/training/adam.py), not pow(beta, step); alpha is computed once per call.
/// Every operation is an IEEE float32 add, subtract, multiply, divide or square root, never
/// fused (the kernels build with -ffp-contract=off), so the result is the same on every CPU and
/// ISA, and bit-identical to TF's own CPU kernels wherever those are not compiled with FMA (the
/// stock tensorflow-cpu wheels are not: tests/data/ps/tf_optimizer_vectors.json holds TF 2.21's
/// updates, matched bit for bit by tests/unit/kernels/optimizer_test.cc). NaN and Inf propagate as
/// IEEE arithmetic does; nothing is clipped.
///
/// @param options  validated here (validate()) on every call.
/// @param var      the variable, `count` floats, updated in place.
/// @param grad     the gradient, `count` floats; read only.
/// @param slots    num_slots(options.kind) pointers (unused and may be nullptr for kSgd), each to
///                 `count` floats in the order of slot_name(): the caller keeps them between calls
///                 and zero-initialises them before the first step, as TF's slot initialisers do.
/// @param count    number of elements; 0 does nothing (but still validates).
/// @param step     1-based number of updates this variable has received, this one included (TF's
///                 t; the first call passes 1); kAdam only, ignored otherwise.
/// var, grad and the slots must not overlap. Blocking, runs on the calling thread, never
/// allocates. Thread safety: a pure function of its arguments; calls on disjoint buffers may run
/// concurrently (a per-thread cache of the last beta powers makes Adam's consecutive steps O(1)
/// without changing any result).
/// @throws mwms::InvalidArgument for invalid options, a null var/grad/slot with count > 0, or
///         kAdam with step < 1; nothing is changed then.
MWMS_API void apply_gradient(const OptimizerOptions& options, float* var, const float* grad,
                             float* const* slots, std::size_t count, std::int64_t step);

}  // namespace mwms
