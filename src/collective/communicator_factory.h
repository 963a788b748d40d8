// Building a communicator: options resolved from CommunicatorOptions and MWMS_* variables, the
// peer-info exchange, one transport per peer, the link mesh and control plane, the backend.
#pragma once

#include <memory>

#include "collective/backend/backend.h"
#include "mwms/communicator.h"

namespace mwms::collective {

/// Communicator::create. @throws as documented there.
std::unique_ptr<Communicator> create_communicator(const ResolvedCluster& cluster,
                                                  const CommunicatorOptions& options);

/// The front end over `backend` (null for a world of one).
std::unique_ptr<Communicator> make_front_end(ResolvedCluster cluster,
                                             std::unique_ptr<Backend> backend, double timeout);

}  // namespace mwms::collective
