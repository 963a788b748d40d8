// DeviceCommunicator::create with a chosen NcclApi (the real one, or a fake in tests).
#pragma once

#include <memory>

#include "collective/backend/nccl_api.h"
#include "mwms/device_communicator.h"

namespace mwms::collective {

/// DeviceCommunicator::create over `api` (null: this build has no NCCL -> InvalidUsage).
/// @throws as DeviceCommunicator::create.
std::unique_ptr<DeviceCommunicator> create_device_communicator(const ResolvedCluster& cluster,
                                                               const CommunicatorOptions& options,
                                                               const NcclApi* api);

/// Hex text of an id (the peer-info blob) and back; false for text that is not 256 hex digits.
std::string to_hex(const NcclUniqueId& id);
bool from_hex(const std::string& text, NcclUniqueId* id);

}  // namespace mwms::collective
