// How the NCCL unique id reaches every rank (Note [nccl unique id]): one message, made on rank 0
// and read on every rank, carried either as text in the rendezvous' peer info or by a broadcast
// over a Communicator.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "collective/backend/nccl_api.h"
#include "mwms/communicator.h"
#include "mwms/errors.h"

namespace mwms::collective {

/// The one unique-id message (Note [nccl unique id]): word 0 is ncclGetUniqueId's status on
/// rank 0 (kNcclSuccess or NCCL's code), words 1..32 the id's 128 bytes (zero after a failure).
struct UniqueIdMessage {
  std::array<std::int32_t, 1 + sizeof(NcclUniqueId::bytes) / 4> words{};
};

/// Rank 0's side: calls ncclGetUniqueId and packs its status and id. Never throws.
UniqueIdMessage make_unique_id_message(const NcclApi& api);

/// Every rank's side (rank 0's too): the id of `message`. `leader_here` is true on the rank that
/// made it; `leader` names that rank in the others' errors ("rank 0", "worker 0").
/// @throws BackendError the status was a failure: NCCL's code, `ctx`, on every rank alike.
NcclUniqueId read_unique_id_message(const NcclApi& api, const UniqueIdMessage& message,
                                    bool leader_here, const std::string& leader,
                                    const ErrorContext& ctx);

/// Hex text of a message (the rendezvous' "nccl" peer-info blob, 264 digits) and back; from_hex
/// is false for any text that is not exactly that many lower-case hex digits.
std::string to_hex(const UniqueIdMessage& message);
bool from_hex(const std::string& text, UniqueIdMessage* message);

/// Hex text of an id (256 digits) and back, for logs and tests.
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
