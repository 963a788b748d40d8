// Note [nccl unique id]: NCCL needs its 128-byte unique id, made by one rank with
// ncclGetUniqueId, on every rank before ncclCommInitRankConfig. We send it through our own
// bootstrap rather than NCCL's or MPI's, so any launcher our bootstrap understands works and the
// id never needs a side channel. It is one message, UniqueIdMessage (ncclGetUniqueId's status on
// rank 0, then the id's bytes), made by make_unique_id_message() on rank 0 and read by
// read_unique_id_message() on every rank, so a failing ncclGetUniqueId fails every rank at once
// with its code, whichever way the message travelled. It has two carriers, depending on what
// exists when it is needed:
//   - a Communicator, whenever one is already up: share_unique_id() broadcasts the message over
//     it (DeviceCommunicator's kAuto, over the engine it decided with; the strategy's GPU
//     replicas, over the strategy's Communicator, src/collective/device_group.cc);
//   - the rendezvous, for DeviceCommunicator's kNccl, which builds no engine: rank 0 publishes
//     the message, hex-encoded (to_hex), as the "nccl" blob of its peer info; the rendezvous
//     (TF_CONFIG's TCP exchange, or MPI's for mpirun jobs) hands every rank every peer's info,
//     so each rank reads rank 0's blob (device_communicator.cc).
#include "collective/backend/nccl_unique_id.h"

#include <array>
#include <cstdint>
#include <cstring>

#include "collective/backend/nccl_group.h"

namespace mwms::collective {

namespace {

constexpr char kHexDigits[] = "0123456789abcdef";

std::string hex_of(const void* data, std::size_t n) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  std::string text;
  text.reserve(n * 2);
  for (std::size_t i = 0; i < n; ++i) {
    text += kHexDigits[bytes[i] >> 4];
    text += kHexDigits[bytes[i] & 15];
  }
  return text;
}

// Bounded: a peer's blob is outside input; anything but exactly 2n lower-case hex digits is
// refused, and `out` may then hold part of the text.
bool parse_hex(const std::string& text, void* out, std::size_t n) {
  if (text.size() != n * 2) return false;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  auto* bytes = static_cast<unsigned char*>(out);
  for (std::size_t i = 0; i < n; ++i) {
    const int hi = nibble(text[2 * i]), lo = nibble(text[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    bytes[i] = static_cast<unsigned char>(hi * 16 + lo);
  }
  return true;
}

}  // namespace

std::string to_hex(const UniqueIdMessage& message) {
  return hex_of(message.words.data(), sizeof(message.words));
}

bool from_hex(const std::string& text, UniqueIdMessage* message) {
  return parse_hex(text, message->words.data(), sizeof(message->words));
}

std::string to_hex(const NcclUniqueId& id) { return hex_of(id.bytes.data(), id.bytes.size()); }

bool from_hex(const std::string& text, NcclUniqueId* id) {
  return parse_hex(text, id->bytes.data(), id->bytes.size());
}

UniqueIdMessage make_unique_id_message(const NcclApi& api) {
  UniqueIdMessage message{};
  NcclUniqueId id;
  message.words[0] = api.get_unique_id(&id);
  // The id's bytes only on success: a failed call's id is not NCCL's to hand out.
  if (message.words[0] == kNcclSuccess) std::memcpy(&message.words[1], id.bytes.data(), id.bytes.size());
  return message;
}

NcclUniqueId read_unique_id_message(const NcclApi& api, const UniqueIdMessage& message,
                                    bool leader_here, const std::string& leader,
                                    const ErrorContext& ctx) {
  if (message.words[0] != kNcclSuccess) {
    const std::string call = leader_here ? "ncclGetUniqueId" : "ncclGetUniqueId (" + leader + ")";
    std::rethrow_exception(to_error(api, NativeSource::kNccl, message.words[0], call, nullptr, ctx));
  }
  NcclUniqueId id;
  std::memcpy(id.bytes.data(), &message.words[1], id.bytes.size());
  return id;
}

NcclUniqueId share_unique_id(const NcclApi& api, Communicator& comm, const std::string& leader,
                             ErrorContext ctx) {
  ctx.transport = "nccl";
  // One broadcast: the status and the id together, so a failure on rank 0 fails every rank.
  UniqueIdMessage message{};
  if (comm.rank() == 0) message = make_unique_id_message(api);
  comm.broadcast(message.words.data(), message.words.size(), DataType::kInt32, 0);
  return read_unique_id_message(api, message, comm.rank() == 0, leader, ctx);
}

}  // namespace mwms::collective
