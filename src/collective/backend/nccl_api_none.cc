// real_nccl_api() in a build without NCCL: there is none (DeviceCommunicator::create says so).
#include "collective/backend/nccl_api.h"

namespace mwms::collective {

const NcclApi* real_nccl_api() noexcept { return nullptr; }

}  // namespace mwms::collective
