#include "collective/engine/control_frames.h"

namespace mwms::collective {

namespace {

constexpr std::uint64_t kNoCollective = ~std::uint64_t{0};  // the ready frame's seq

FrameHeader of_kind(CollectiveKind kind) noexcept {
  FrameHeader h;
  h.kind = static_cast<std::uint8_t>(kind);
  return h;
}

}  // namespace

FrameHeader encode(const ReadyFrame& f) noexcept {
  FrameHeader h = of_kind(CollectiveKind::kBarrier);
  h.seq = kNoCollective;
  h.root = f.sender;
  return h;
}

FrameHeader encode(const AbortFrame& f) noexcept {
  FrameHeader h = of_kind(CollectiveKind::kAbort);
  h.root = f.failed_rank;
  h.op = static_cast<std::uint8_t>(f.cause);
  h.dtype = static_cast<std::uint8_t>(f.failure);
  h.payload_bytes = f.reason_bytes;
  return h;
}

FrameHeader encode(const StallFrame& f) noexcept {
  FrameHeader h = of_kind(CollectiveKind::kStallNotice);
  h.root = f.waited_for;
  h.step = f.waiter;
  h.seq = f.seq;
  return h;
}

FrameHeader encode(const FinalizedFrame& f) noexcept {
  FrameHeader h = of_kind(CollectiveKind::kFinalized);
  h.root = f.sender;
  h.seq = f.collectives;
  return h;
}

FrameHeader encode(const HeartbeatFrame& f) noexcept {
  FrameHeader h = of_kind(CollectiveKind::kHeartbeat);
  h.root = f.sender;
  h.count = f.interval_ms;
  return h;
}

bool is_ready_frame(const FrameHeader& h) noexcept {
  return h.magic == kFrameMagic && h.kind == static_cast<std::uint8_t>(CollectiveKind::kBarrier) &&
         h.seq == kNoCollective;
}

ReadyFrame ready_frame_of(const FrameHeader& h) noexcept { return {h.root}; }

AbortFrame abort_frame_of(const FrameHeader& h) noexcept {
  AbortFrame f;
  f.failed_rank = h.root;
  // A cause or failure this build does not know of reads as the plain peer failure / unknown.
  f.cause = h.op == static_cast<std::uint8_t>(AbortCause::kMismatch)  ? AbortCause::kMismatch
            : h.op == static_cast<std::uint8_t>(AbortCause::kTimeout) ? AbortCause::kTimeout
                                                                       : AbortCause::kPeer;
  f.failure = h.dtype <= static_cast<std::uint8_t>(FailureCause::kStalled)
                  ? static_cast<FailureCause>(h.dtype)
                  : FailureCause::kUnknown;
  f.reason_bytes = h.payload_bytes;
  return f;
}

StallFrame stall_frame_of(const FrameHeader& h) noexcept { return {h.step, h.root, h.seq}; }

FinalizedFrame finalized_frame_of(const FrameHeader& h) noexcept { return {h.root, h.seq}; }

HeartbeatFrame heartbeat_frame_of(const FrameHeader& h) noexcept { return {h.root, h.count}; }

}  // namespace mwms::collective
