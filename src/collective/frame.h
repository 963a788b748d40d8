// Wire frame of every ring transfer. Note [frame header]: each transfer of a collective is one
// header followed by exactly `payload_bytes` of payload. The receiver knows what it expects
// (kind, dtype, op, seq, step, count, root, payload size) and checks every field before the
// payload is used, so a rank that called a different collective, or a corrupt stream, is reported
// instead of corrupting memory. Nothing is allocated from a length read off the wire.
#pragma once

#include <cstdint>
#include <string>

#include "mwms/errors.h"
#include "mwms/types.h"

namespace mwms::collective {

enum class CollectiveKind : std::uint8_t {
  kAllReduce = 1,
  kReduceScatter = 2,
  kAllGather = 3,
  kBroadcast = 4,
  kBarrier = 5,
  kHeartbeat = 0x7c,    // control only: rank `root` is alive, count = its interval in ms
                        // (Note [heartbeat] in engine/control_plane.h)
  kFinalized = 0x7d,    // control only: rank `root` finalized after `seq` collectives (Note [finalize])
  kStallNotice = 0x7e,  // control only: "I am blocked waiting for rank `root`" (seq = collective)
  kAbort = 0x7f,        // control only: rank `root` failed, payload = reason
};

constexpr std::uint32_t kFrameMagic = 0x464D574D;  // "MWMF" little-endian
constexpr std::uint16_t kFrameVersion = 1;
constexpr std::size_t kMaxAbortReasonBytes = 4096;

#pragma pack(push, 1)
struct FrameHeader {
  std::uint32_t magic = kFrameMagic;
  std::uint16_t version = kFrameVersion;
  std::uint8_t kind = 0;
  std::uint8_t dtype = 0;
  std::uint8_t op = 0;
  std::uint8_t algorithm = 0;  // which plan produced the frame (ranks must agree)
  std::uint8_t reserved[2] = {0, 0};
  std::int32_t step = 0;
  std::int32_t root = -1;   // broadcast root; for kAbort the rank that failed
  std::uint64_t seq = 0;
  std::uint64_t count = 0;  // elements of the whole collective, as the caller passed them
  std::uint64_t payload_bytes = 0;
};
#pragma pack(pop)
static_assert(sizeof(FrameHeader) == 44, "frame header layout is part of the wire protocol");

/// "all_reduce", "broadcast", ...
const char* kind_name(CollectiveKind kind);
/// "all_reduce(count 10, float32, sum) seq 3 [ring]", "barrier() seq 4 [rd]": the call `h`
/// describes, with the fields its kind's caller passes, the seq and the algorithm tag.
std::string describe(const FrameHeader& h);
/// As describe(h), plus every field in which `h` differs from `other` when both are the same kind
/// (Note [mismatch text] in frame.cc): the two sides of a mismatch never read the same.
std::string describe(const FrameHeader& h, const FrameHeader& other);

/// Checks `got` (from peer `ctx.peer_rank`) against `expected`. @throws PeerError for a bad magic
/// or version (corrupt stream), CollectiveMismatchError when the calls differ.
void check_frame(const FrameHeader& expected, const FrameHeader& got, const ErrorContext& ctx);

}  // namespace mwms::collective
