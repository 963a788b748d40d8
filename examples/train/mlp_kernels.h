/// @file mlp_kernels.h
/// The MLP's matrix work (Eigen) on raw column-major buffers, compiled once per x86-64 ISA level
/// and chosen at run time (Note [train cpu dispatch]).
///
/// Note [train cpu dispatch]: a training step is almost all matrix products, and Eigen picks its
/// vector width at compile time: built for x86-64's SSE2 baseline, the MLP runs at about 60% of
/// the speed it has built for AVX2 or AVX-512. A binary built with -march=native dies of SIGILL
/// on an older CPU, so instead these kernels are compiled three times (mlp_kernels.cc at the
/// baseline, mlp_kernels_v3.cc at -march=x86-64-v3, mlp_kernels_v4.cc at -march=x86-64-v4), each
/// copy with Eigen's namespace renamed by the preprocessor so that no inline Eigen function of
/// one ISA level is merged with another's by the linker, and mlp_kernels() picks the widest level
/// the CPU supports once (as the library's reduce kernels do, src/kernels). The copies sit in a
/// static library linked after the program's own objects, so any other inline function they share
/// with the program (std::) resolves to the program's baseline copy. Every level computes the
/// same products; the rounding differs between levels (FMA, summation order), so results are
/// equal across levels within float tolerance only, and bit-equal within one binary on one CPU.
#pragma once

#include <cstddef>

namespace mwms::train::detail {

/// Layer sizes (MlpShape's).
struct MlpDims {
  int inputs = 0;
  int hidden = 0;
  int classes = 0;
};

/// Forward pass: hidden = relu(W1 x + b1) (hidden x batch), logits = W2 hidden + b2
/// (classes x batch). `params` holds W1, b1, W2, b2 back to back (Note [flat parameters]).
struct MlpForwardArgs {
  const float* params = nullptr;
  MlpDims dims;
  const float* x = nullptr;  // inputs x batch, column-major
  int batch = 0;             // >= 1
  float* hidden = nullptr;
  float* logits = nullptr;
};

/// Backward pass after MlpForwardArgs and the softmax: writes every gradient into `grads`
/// (params' layout) in backprop order, calling ready(ctx, i) when piece i is final
/// (Note [backprop order] in mlp.cc; w1_blocks blocks of dense_1/kernel when ready is set).
struct MlpBackwardArgs {
  const float* params = nullptr;
  float* grads = nullptr;
  MlpDims dims;
  const float* x = nullptr;
  int batch = 0;
  const float* hidden = nullptr;    // the forward pass's ReLU activations
  const float* d_logits = nullptr;  // d loss / d logits (classes x batch)
  float* d_hidden = nullptr;        // scratch, hidden x batch
  void (*ready)(const void* ctx, std::size_t piece) = nullptr;
  const void* ctx = nullptr;
  int w1_blocks = 1;
};

/// One ISA level's kernels. Pure functions of their arguments; thread-safe on distinct buffers.
struct MlpKernels {
  const char* isa;  // "x86-64", "x86-64-v3", "x86-64-v4"
  void (*forward)(const MlpForwardArgs&);
  void (*backward)(const MlpBackwardArgs&);
};

/// The widest level this CPU runs, chosen on the first call (thread-safe).
const MlpKernels& mlp_kernels();

/// Every level compiled into this binary that this CPU can run, baseline first (for tests).
std::size_t mlp_kernel_levels(const MlpKernels** out, std::size_t capacity);

}  // namespace mwms::train::detail
