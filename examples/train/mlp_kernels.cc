// The MLP kernels at the build's baseline ISA and the run-time choice among the levels compiled
// in (Note [train cpu dispatch] in mlp_kernels.h).
#define MWMS_MLP_LEVEL baseline
#define MWMS_MLP_LEVEL_NAME "x86-64"
#include "mlp_kernels_impl.h"

namespace mwms::train::detail {

#if MWMS_TRAIN_X86_LEVELS
namespace x86_64_v3 {
extern const MlpKernels kKernels;
}
namespace x86_64_v4 {
extern const MlpKernels kKernels;
}
#endif

std::size_t mlp_kernel_levels(const MlpKernels** out, std::size_t capacity) {
  std::size_t n = 0;
  const auto add = [&](const MlpKernels& k) {
    if (n < capacity) out[n] = &k;
    ++n;
  };
  add(baseline::kKernels);
#if MWMS_TRAIN_X86_LEVELS
  __builtin_cpu_init();
  if (__builtin_cpu_supports("x86-64-v3")) add(x86_64_v3::kKernels);
  if (__builtin_cpu_supports("x86-64-v4")) add(x86_64_v4::kKernels);
#endif
  return n < capacity ? n : capacity;
}

const MlpKernels& mlp_kernels() {
  static const MlpKernels& chosen = [] () -> const MlpKernels& {
    const MlpKernels* levels[3] = {};
    const std::size_t n = mlp_kernel_levels(levels, 3);
    return *levels[n - 1];
  }();
  return chosen;
}

}  // namespace mwms::train::detail
