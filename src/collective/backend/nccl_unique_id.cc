// Note [nccl unique id]: NCCL needs its 128-byte unique id, made by one rank with
// ncclGetUniqueId, on every rank before ncclCommInitRankConfig. We send it through our own
// bootstrap rather than NCCL's or MPI's, so any launcher our bootstrap understands works and the
// id never needs a side channel. It has one message (ncclGetUniqueId's status on rank 0, then
// the id's bytes) and two carriers, depending on what exists when it is needed:
//   - a Communicator, whenever one is already up: share_unique_id() broadcasts the message over
//     it (DeviceCommunicator's kAuto, over the engine it decided with; the strategy's GPU
//     replicas, over the strategy's Communicator, src/collective/device_group.cc);
//   - the rendezvous, for DeviceCommunicator's kNccl, which builds no engine: rank 0 makes the id
//     before the rendezvous and publishes it, hex-encoded (to_hex), as the "nccl" blob of its
//     peer info; the rendezvous (TF_CONFIG's TCP exchange, or MPI's for mpirun jobs) hands every
//     rank every peer's info, so each rank reads rank 0's blob (device_communicator.cc).
#include "collective/backend/nccl_unique_id.h"

#include <array>
#include <cstdint>
#include <cstring>

#include "collective/backend/nccl_group.h"

namespace mwms::collective {

namespace {

constexpr char kHexDigits[] = "0123456789abcdef";

}  // namespace

std::string to_hex(const NcclUniqueId& id) {
  std::string text;
  text.reserve(id.bytes.size() * 2);
  for (unsigned char b : id.bytes) {
    text += kHexDigits[b >> 4];
    text += kHexDigits[b & 15];
  }
  return text;
}

bool from_hex(const std::string& text, NcclUniqueId* id) {
  if (text.size() != id->bytes.size() * 2) return false;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  for (std::size_t i = 0; i < id->bytes.size(); ++i) {
    const int hi = nibble(text[2 * i]), lo = nibble(text[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    id->bytes[i] = static_cast<unsigned char>(hi * 16 + lo);
  }
  return true;
}

NcclUniqueId share_unique_id(const NcclApi& api, Communicator& comm, const std::string& leader,
                             ErrorContext ctx) {
  ctx.transport = "nccl";
  NcclUniqueId id;
  // Word 0: ncclGetUniqueId's status on rank 0; words 1..32: the id. One broadcast.
  std::array<std::int32_t, 1 + sizeof(NcclUniqueId::bytes) / 4> message{};
  if (comm.rank() == 0) {
    message[0] = api.get_unique_id(&id);
    std::memcpy(&message[1], id.bytes.data(), id.bytes.size());
  }
  comm.broadcast(message.data(), message.size(), DataType::kInt32, 0);
  if (message[0] != kNcclSuccess) {
    const std::string call =
        comm.rank() == 0 ? "ncclGetUniqueId" : "ncclGetUniqueId (" + leader + ")";
    std::rethrow_exception(to_error(api, NativeSource::kNccl, message[0], call, nullptr, ctx));
  }
  std::memcpy(id.bytes.data(), &message[1], id.bytes.size());
  return id;
}

}  // namespace mwms::collective
