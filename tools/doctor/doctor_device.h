// What mwms-doctor says about GPUs: whether this build has CUDA and the NCCL backend, and how many
// devices the CUDA runtime sees. doctor_device_cuda.cc (CUDA builds: the runtime API only, never
// libcuda, Note [cuda build] in cmake/mwms_cuda.cmake) or doctor_device_none.cc (CPU-only builds)
// implements it; CMake picks the file, so no feature #if is needed here.
#pragma once

#include <string>

namespace mwms::tools {

/// The build's GPU support and the devices visible to this process.
struct DeviceReport {
  bool cuda_built = false;     ///< libmwms has the CUDA kernels (MWMS_HAVE_CUDA)
  bool nccl_built = false;     ///< libmwms has the NCCL backend (MWMS_HAVE_NCCL)
  std::string runtime;         ///< "CUDA runtime 13.0" when cuda_built, else empty
  int devices = -1;            ///< cudaGetDeviceCount's count; -1 when it failed or no CUDA
  std::string error;           ///< why there is no count: "no driver (<cudaGetErrorString>)"
};

/// Probes once (cudaGetDeviceCount, which loads the driver lazily: it fails, it does not abort,
/// on a machine without one). Blocking for at most the driver's initialisation; never throws.
DeviceReport probe_devices() noexcept;

}  // namespace mwms::tools
