// DeviceCommunicator::create with chosen NcclApi and CudaApi tables (the real ones, or fakes in
// tests).
#pragma once

#include <memory>

#include "collective/backend/cuda_api.h"
#include "collective/backend/nccl_api.h"
#include "mwms/device_communicator.h"

namespace mwms::collective {

/// DeviceCommunicator::create over `nccl` (null: this build has no NCCL) and `cuda` (null: no
/// CUDA; the host-staged path is then impossible), choosing the backend as Note [device backend
/// choice] says. @throws as DeviceCommunicator::create.
std::unique_ptr<DeviceCommunicator> create_device_communicator(const ResolvedCluster& cluster,
                                                               const CommunicatorOptions& options,
                                                               const NcclApi* nccl,
                                                               const CudaApi* cuda);

/// Hex text of an id (the peer-info blob) and back; false for text that is not 256 hex digits.
std::string to_hex(const NcclUniqueId& id);
bool from_hex(const std::string& text, NcclUniqueId* id);

}  // namespace mwms::collective
