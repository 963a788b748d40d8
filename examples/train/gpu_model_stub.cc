// gpu_model.h for a train built without its GPU models (no CUDA, or CUDA without cuDNN): no
// device is offered and make_gpu_model() says why (examples/CMakeLists.txt picks this file).
#include "gpu_model.h"

#include "mwms/config.h"
#include "mwms/errors.h"

namespace mwms::train {

GpuAvailability gpu_availability() noexcept {
  GpuAvailability a;
  a.built = false;
  a.devices = 0;
  a.reason = MWMS_HAVE_CUDA
                 ? "this train was built without its GPU models: libmwms has CUDA, but cuDNN was "
                   "not found (install cuDNN 9 next to the CUDA toolkit or set CUDNN_ROOT, then "
                   "reconfigure)"
                 : "this train was built without CUDA (MWMS_HAVE_CUDA 0: configure with "
                   "-DMWMS_WITH_CUDA=ON where the CUDA toolkit, NCCL and cuDNN are installed)";
  return a;
}

std::unique_ptr<GpuModel> make_gpu_model(std::unique_ptr<Model>, int, int) {
  throw InvalidUsage("--device gpu: " + gpu_availability().reason);
}

}  // namespace mwms::train
