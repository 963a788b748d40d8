// main() of the GPU test executables (tests/cuda): without a usable device (no driver:
// cudaErrorInsufficientDriver, or no GPU) the executable prints why and exits with
// kSkipReturnCode, which CTest reports as skipped (SKIP_RETURN_CODE), never as passed.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <cstdio>

constexpr int kSkipReturnCode = 77;

int main(int argc, char** argv) {
  int devices = 0;
  const cudaError_t err = cudaGetDeviceCount(&devices);
  if (err != cudaSuccess || devices == 0) {
    std::printf("SKIPPED: no CUDA device (cudaGetDeviceCount: %s, %d device(s))\n",
                err == cudaSuccess ? "cudaSuccess" : cudaGetErrorName(err), devices);
    return kSkipReturnCode;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
    std::printf("device 0: %s, compute capability %d.%d\n", prop.name, prop.major, prop.minor);
  }
  return Catch::Session().run(argc, argv);
}
