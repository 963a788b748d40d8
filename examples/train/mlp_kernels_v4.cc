// The MLP kernels at x86-64-v4 (AVX-512 F/BW/DQ/VL), compiled with -march=x86-64-v4
// (examples/CMakeLists.txt) and Eigen's namespace renamed: Note [train cpu dispatch] in
// mlp_kernels.h.
#define Eigen mwms_eigen_x86_64_v4
#define MWMS_MLP_LEVEL x86_64_v4
#define MWMS_MLP_LEVEL_NAME "x86-64-v4"
#include "mlp_kernels_impl.h"
