#include "collective/engine/control_frames.h"

namespace mwms::collective {

namespace {

// The ready frame's seq: seqs count collectives from 0 and never get there, so a ready frame can
// never be taken for a real barrier's envelope, nor the other way round.
constexpr std::uint64_t kNoCollective = ~std::uint64_t{0};

// FrameHeader's defaults carry the magic and version, so every control frame passes the same
// envelope check as data frames; fields a protocol leaves out keep their defaults (0, root -1).
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
  // An abort has no op or dtype of its own: those bytes carry the causes, so a relayed error
  // keeps its class (mismatch, timeout) and its FailureCause (died, stalled).
  h.op = static_cast<std::uint8_t>(f.cause);
  h.dtype = static_cast<std::uint8_t>(f.failure);
  h.payload_bytes = f.reason_bytes;  // the reader caps what it reads (kMaxAbortReasonBytes)
  return h;
}

FrameHeader encode(const StallFrame& f) noexcept {
  FrameHeader h = of_kind(CollectiveKind::kStallNotice);
  h.root = f.waited_for;  // -1: the waiter moves again (it clears its edge)
  h.step = f.waiter;
  h.seq = f.seq;
  return h;
}

FrameHeader encode(const FinalizedFrame& f) noexcept {
  FrameHeader h = of_kind(CollectiveKind::kFinalized);
  h.root = f.sender;  // checked against the link's peer: a frame never speaks for another rank
  h.seq = f.collectives;
  return h;
}

FrameHeader encode(const HeartbeatFrame& f) noexcept {
  FrameHeader h = of_kind(CollectiveKind::kHeartbeat);
  h.root = f.sender;
  // The sender's own interval: the receiver declares it lost after kLostIntervals of the larger
  // of both intervals, so ranks with different MWMS_HEARTBEAT_SECONDS never lose each other early.
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
  // FailureCause is numbered densely up to kStalled, so a range test decides which values exist.
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
