// DeviceCommunicator::create with chosen NcclApi and CudaApi tables (the real ones, or fakes in
// tests).
#pragma once

#include <memory>

#include "collective/backend/cuda_api.h"
#include "collective/backend/nccl_api.h"
#include "collective/backend/nccl_unique_id.h"  // to_hex, from_hex (tests)
#include "mwms/device_communicator.h"

namespace mwms::collective {

/// DeviceCommunicator::create over `nccl` (null: this build has no NCCL) and `cuda` (null: no
/// CUDA; the host-staged path is then impossible), choosing the backend as Note [device backend
/// choice] says. @throws as DeviceCommunicator::create.
std::unique_ptr<DeviceCommunicator> create_device_communicator(const ResolvedCluster& cluster,
                                                               const CommunicatorOptions& options,
                                                               const NcclApi* nccl,
                                                               const CudaApi* cuda);

}  // namespace mwms::collective
