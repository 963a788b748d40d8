// mwms-doctor's GPU line in a CUDA build (doctor_device.h): the runtime API only.
#include <cuda_runtime.h>

#include "mwms/config.h"
#include "doctor_device.h"

namespace mwms::tools {

DeviceReport probe_devices() noexcept {
  DeviceReport r;
  r.cuda_built = true;
  r.nccl_built = MWMS_HAVE_NCCL != 0;
  try {
    int version = 0;
    if (cudaRuntimeGetVersion(&version) == cudaSuccess) {
      r.runtime = "CUDA runtime " + std::to_string(version / 1000) + "." +
                  std::to_string(version % 1000 / 10);
    } else {
      r.runtime = "CUDA runtime";
    }
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e == cudaSuccess) {
      r.devices = count;
    } else {
      // cudaErrorInsufficientDriver, cudaErrorNoDevice, ...: no usable driver or no GPU.
      r.error = std::string("no driver (cudaGetDeviceCount: ") + cudaGetErrorString(e) + ")";
    }
  } catch (...) {
    r.error = "no driver (out of memory describing it)";
  }
  return r;
}

}  // namespace mwms::tools
