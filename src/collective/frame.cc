#include "collective/frame.h"

#include "collective/algorithms/algorithm.h"

namespace mwms::collective {

const char* kind_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllReduce: return "all_reduce";
    case CollectiveKind::kReduceScatter: return "reduce_scatter";
    case CollectiveKind::kAllGather: return "all_gather";
    case CollectiveKind::kBroadcast: return "broadcast";
    case CollectiveKind::kBarrier: return "barrier";
    case CollectiveKind::kAbort: return "abort";
    case CollectiveKind::kStallNotice: return "stall notice";
    case CollectiveKind::kFinalized: return "finalized";
    case CollectiveKind::kHeartbeat: return "heartbeat";
  }
  return "unknown";
}

std::string describe(const FrameHeader& h) {
  std::string out = std::string(kind_name(static_cast<CollectiveKind>(h.kind))) + "(count " +
                    std::to_string(h.count) + ", " +
                    std::string(to_string(static_cast<DataType>(h.dtype)));
  auto kind = static_cast<CollectiveKind>(h.kind);
  if (kind == CollectiveKind::kAllReduce || kind == CollectiveKind::kReduceScatter) {
    out += ", " + std::string(to_string(static_cast<ReduceOp>(h.op)));
  }
  if (kind == CollectiveKind::kBroadcast) out += ", root " + std::to_string(h.root);
  out += ") seq " + std::to_string(h.seq);
  if (kind == CollectiveKind::kAllReduce) {
    out += std::string(" [") + algorithm_name(h.algorithm) + "]";
  }
  return out;
}

void check_frame(const FrameHeader& expected, const FrameHeader& got, const ErrorContext& ctx) {
  if (got.magic != kFrameMagic || got.version != kFrameVersion) {
    throw PeerError("corrupt frame from peer (magic " + std::to_string(got.magic) + ", version " +
                        std::to_string(got.version) + "; expected a libmwms v" +
                        std::to_string(kFrameVersion) + " frame)",
                    ctx);
  }
  bool same_call = got.kind == expected.kind && got.dtype == expected.dtype &&
                   got.op == expected.op && got.count == expected.count &&
                   got.root == expected.root && got.seq == expected.seq &&
                   got.algorithm == expected.algorithm;
  if (!same_call) {
    throw CollectiveMismatchError("ranks called different collectives: this rank called " +
                                      describe(expected) + " but peer rank " +
                                      std::to_string(ctx.peer_rank) + " called " + describe(got) +
                                      "; every rank must call the same collectives in the same "
                                      "order with the same count, dtype, op and root (and the "
                                      "same MWMS_SMALL_MESSAGE_BYTES and MWMS_ALGO)",
                                  ctx);
  }
  if (got.step != expected.step || got.payload_bytes != expected.payload_bytes) {
    throw PeerError("out-of-order frame from peer: step " + std::to_string(got.step) + " with " +
                        std::to_string(got.payload_bytes) + " bytes, expected step " +
                        std::to_string(expected.step) + " with " +
                        std::to_string(expected.payload_bytes) + " bytes",
                    ctx);
  }
}

}  // namespace mwms::collective
