// The MLP kernels at x86-64-v3 (AVX2, FMA), compiled with -march=x86-64-v3 (examples/CMakeLists.txt)
// and Eigen's namespace renamed: Note [train cpu dispatch] in mlp_kernels.h.
#define Eigen mwms_eigen_x86_64_v3
#define MWMS_MLP_LEVEL x86_64_v3
#define MWMS_MLP_LEVEL_NAME "x86-64-v3"
#include "mlp_kernels_impl.h"
