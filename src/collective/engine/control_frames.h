// Note [control frames]: every message of the control plane (control_plane.h) is one FrameHeader,
// the envelope of every link (checked for magic and version by the same code), whose kind names
// the protocol; an abort carries its reason as payload, the others none. Each protocol gives the
// header's fields its own meaning, and this file alone says which field carries which, so that
// a reader of control_plane.cc sees named fields and the wire layout stays in one place:
//
//   protocol            kind          root           step    seq              count     op     dtype
//   ready barrier       kBarrier      sender         -       ~0 (no call)     -         -      -
//   abort relay         kAbort        failed rank    -       -                -         cause  failure
//   stall blame         kStallNotice  waited for/-1  waiter  the collective   -         -      -
//   finalize            kFinalized    sender         0       collectives done -         -      -
//   heartbeat           kHeartbeat    sender         -       -                interval  -      -
//
// Decoders never validate: the control plane checks every field before believing it (Note
// [finalize], Note [heartbeat]); they only map unknown enum values to the safe default.
#pragma once

#include <cstdint>

#include "collective/frame.h"
#include "mwms/errors.h"

namespace mwms::collective {

/// Why a rank aborted; carried in the abort frame so relayed errors keep their class.
enum class AbortCause : std::uint8_t { kPeer = 0, kMismatch = 1, kTimeout = 2 };

/// "My links are up" at the end of start-up (ControlPlane::ready_barrier).
struct ReadyFrame {
  int sender = -1;
};
/// A rank failed (Note [abort relay]); the reason, reason_bytes long, follows as payload.
struct AbortFrame {
  int failed_rank = -1;
  AbortCause cause = AbortCause::kPeer;
  FailureCause failure = FailureCause::kUnknown;
  std::uint64_t reason_bytes = 0;
};
/// Note [stall blame]: `waiter` waits for `waited_for` (-1: no longer waits) in collective `seq`.
struct StallFrame {
  int waiter = -1;
  int waited_for = -1;
  std::uint64_t seq = 0;
};
/// Note [finalize]: `sender` finalized after `collectives` collectives.
struct FinalizedFrame {
  int sender = -1;
  std::uint64_t collectives = 0;
};
/// Note [heartbeat]: `sender` is alive and sends one every `interval_ms`.
struct HeartbeatFrame {
  int sender = -1;
  std::uint64_t interval_ms = 0;
};

/// The header of each message. Do not block; never throw.
FrameHeader encode(const ReadyFrame& f) noexcept;
FrameHeader encode(const AbortFrame& f) noexcept;
FrameHeader encode(const StallFrame& f) noexcept;
FrameHeader encode(const FinalizedFrame& f) noexcept;
FrameHeader encode(const HeartbeatFrame& f) noexcept;

/// Whether `h` is a ready frame (kind kBarrier with the seq no collective has).
bool is_ready_frame(const FrameHeader& h) noexcept;
/// The fields of a header whose kind is the protocol's (unchecked: see the Note).
ReadyFrame ready_frame_of(const FrameHeader& h) noexcept;
AbortFrame abort_frame_of(const FrameHeader& h) noexcept;
StallFrame stall_frame_of(const FrameHeader& h) noexcept;
FinalizedFrame finalized_frame_of(const FrameHeader& h) noexcept;
HeartbeatFrame heartbeat_frame_of(const FrameHeader& h) noexcept;

}  // namespace mwms::collective
