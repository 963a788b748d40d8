#include "collective/frame.h"

#include <utility>

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

namespace {

// Which fields of `a` and `b` differ, one bit per field (kind, count, dtype, op, root, seq,
// algorithm).
enum : unsigned {
  kDiffKind = 1, kDiffCount = 2, kDiffDtype = 4, kDiffOp = 8, kDiffRoot = 16, kDiffSeq = 32,
  kDiffAlgorithm = 64,
};
unsigned differences(const FrameHeader& a, const FrameHeader& b) {
  unsigned d = 0;
  if (a.kind != b.kind) d |= kDiffKind;
  if (a.count != b.count) d |= kDiffCount;
  if (a.dtype != b.dtype) d |= kDiffDtype;
  if (a.op != b.op) d |= kDiffOp;
  if (a.root != b.root) d |= kDiffRoot;
  if (a.seq != b.seq) d |= kDiffSeq;
  if (a.algorithm != b.algorithm) d |= kDiffAlgorithm;
  return d;
}

bool is_data_kind(CollectiveKind k) {
  return k == CollectiveKind::kAllReduce || k == CollectiveKind::kReduceScatter ||
         k == CollectiveKind::kAllGather || k == CollectiveKind::kBroadcast ||
         k == CollectiveKind::kBarrier;
}

// Note [mismatch text]: each side of a CollectiveMismatchError shows the fields its kind's users
// pass (a barrier shows none: its count 1, int32, sum token is internal) plus the seq and the
// algorithm tag, and, when both sides call the same kind, every other field in which they differ.
// Without the last part two barriers that differ only in a hidden field (a count or dtype off a
// corrupt-but-plausible or future peer) would print two identical calls; the algorithm tag is on
// every data kind because barriers, like all-reduces, run the all-reduce algorithms (a forced
// MWMS_ALGO or MWMS_SMALL_MESSAGE_BYTES that differs shows up there).
std::string describe_showing(const FrameHeader& h, unsigned extra) {
  const auto kind = static_cast<CollectiveKind>(h.kind);
  const bool has_op = kind == CollectiveKind::kAllReduce || kind == CollectiveKind::kReduceScatter;
  const bool has_data = kind != CollectiveKind::kBarrier;
  std::string fields;
  auto add = [&fields](const std::string& f) { fields += (fields.empty() ? "" : ", ") + f; };
  if (has_data || (extra & kDiffCount) != 0) add("count " + std::to_string(h.count));
  if (has_data || (extra & kDiffDtype) != 0) {
    add(std::string(to_string(static_cast<DataType>(h.dtype))));
  }
  if (has_op || (extra & kDiffOp) != 0) add(std::string(to_string(static_cast<ReduceOp>(h.op))));
  if (kind == CollectiveKind::kBroadcast || (extra & kDiffRoot) != 0) {
    add("root " + std::to_string(h.root));
  }
  std::string out = std::string(kind_name(kind)) + "(" + fields + ") seq " + std::to_string(h.seq);
  if (is_data_kind(kind)) out += std::string(" [") + algorithm_name(h.algorithm) + "]";
  return out;
}

// "count and algorithm" for the fields in `d`.
std::string difference_names(unsigned d) {
  static const std::pair<unsigned, const char*> kNames[] = {
      {kDiffKind, "collective"}, {kDiffCount, "count"}, {kDiffDtype, "dtype"}, {kDiffOp, "op"},
      {kDiffRoot, "root"},       {kDiffSeq, "seq"},     {kDiffAlgorithm, "algorithm"}};
  std::string out;
  for (const auto& [bit, name] : kNames) {
    if ((d & bit) != 0) out += (out.empty() ? "" : ", ") + std::string(name);
  }
  return out;
}

}  // namespace

std::string describe(const FrameHeader& h) { return describe_showing(h, 0); }

std::string describe(const FrameHeader& h, const FrameHeader& other) {
  return describe_showing(h, h.kind == other.kind ? differences(h, other) : 0);
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
    // Note [mismatch text].
    throw CollectiveMismatchError("ranks called different collectives: this rank called " +
                                      describe(expected, got) + " but peer rank " +
                                      std::to_string(ctx.peer_rank) + " called " +
                                      describe(got, expected) + " (they differ in " +
                                      difference_names(differences(expected, got)) +
                                      "); every rank must call the same collectives in the same "
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
