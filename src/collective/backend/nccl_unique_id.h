// How the NCCL unique id reaches every rank (Note [nccl unique id]): its text form for the
// rendezvous' peer info, and its broadcast over a Communicator.
#pragma once

#include <string>

#include "collective/backend/nccl_api.h"
#include "mwms/communicator.h"
#include "mwms/errors.h"

namespace mwms::collective {

/// Hex text of an id (the peer-info blob) and back; false for text that is not 256 hex digits.
std::string to_hex(const NcclUniqueId& id);
bool from_hex(const std::string& text, NcclUniqueId* id);

/// Rank 0 of `comm` makes the id (ncclGetUniqueId) and one broadcast over `comm` carries its
/// status and bytes to every rank (Note [nccl unique id]), so a failure there fails every rank
/// at once. Blocking, collective over `comm`. `leader` names rank 0 in the others' errors
/// ("rank 0", "worker 0"). @throws BackendError (ncclGetUniqueId failed: its code, on every rank;
///   `ctx` with transport "nccl"), and as Communicator::broadcast.
NcclUniqueId share_unique_id(const NcclApi& api, Communicator& comm, const std::string& leader,
                             ErrorContext ctx);

}  // namespace mwms::collective
