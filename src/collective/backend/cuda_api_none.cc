// real_cuda_api() in a build without CUDA: there is none (DeviceCommunicator::create says so).
#include "collective/backend/cuda_api.h"

namespace mwms::collective {

const CudaApi* real_cuda_api() noexcept { return nullptr; }

}  // namespace mwms::collective
