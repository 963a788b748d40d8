// Note [control frames]: each control protocol's fields round-trip and sit where the wire layout
// (the table in control_frames.h) says, so that ranks of one build always read each other.
// FrameHeader is packed: each CHECK reads a field by value (unary +), never binding a reference to
// a misaligned member (UBSan in the asan run).
#include <catch2/catch.hpp>

#include "collective/engine/control_frames.h"

namespace mc = mwms::collective;
using mc::CollectiveKind;

TEST_CASE("control frames round-trip and keep their wire layout", "[unit]") {
  const mc::FrameHeader ready = mc::encode(mc::ReadyFrame{3});
  CHECK(+ready.kind == static_cast<std::uint8_t>(CollectiveKind::kBarrier));
  CHECK(+ready.root == 3);
  CHECK(mc::is_ready_frame(ready));
  CHECK(mc::ready_frame_of(ready).sender == 3);
  mc::FrameHeader call = ready;
  call.seq = 7;  // a barrier collective is no ready frame
  CHECK_FALSE(mc::is_ready_frame(call));

  const mc::FrameHeader abort = mc::encode(mc::AbortFrame{
      2, mc::AbortCause::kTimeout, mwms::FailureCause::kStalled, 17});
  CHECK(+abort.kind == static_cast<std::uint8_t>(CollectiveKind::kAbort));
  CHECK(+abort.root == 2);
  CHECK(+abort.op == 2);     // AbortCause::kTimeout
  CHECK(+abort.dtype == 2);  // FailureCause::kStalled
  CHECK(+abort.payload_bytes == 17);
  mc::AbortFrame a = mc::abort_frame_of(abort);
  CHECK(+a.failed_rank == 2);
  CHECK(a.cause == mc::AbortCause::kTimeout);
  CHECK(a.failure == mwms::FailureCause::kStalled);
  CHECK(+a.reason_bytes == 17);
  mc::FrameHeader odd = abort;  // values this build does not know read as the safe defaults
  odd.op = 200;
  odd.dtype = 200;
  CHECK(mc::abort_frame_of(odd).cause == mc::AbortCause::kPeer);
  CHECK(mc::abort_frame_of(odd).failure == mwms::FailureCause::kUnknown);

  const mc::FrameHeader stall = mc::encode(mc::StallFrame{1, -1, 99});
  CHECK(+stall.kind == static_cast<std::uint8_t>(CollectiveKind::kStallNotice));
  CHECK(+stall.step == 1);
  CHECK(+stall.root == -1);
  CHECK(+stall.seq == 99);
  CHECK(mc::stall_frame_of(stall).waiter == 1);
  CHECK(mc::stall_frame_of(stall).waited_for == -1);
  CHECK(mc::stall_frame_of(stall).seq == 99);

  const mc::FrameHeader fin = mc::encode(mc::FinalizedFrame{4, 1234});
  CHECK(+fin.kind == static_cast<std::uint8_t>(CollectiveKind::kFinalized));
  CHECK(+fin.root == 4);
  CHECK(+fin.seq == 1234);
  CHECK(+fin.step == 0);
  CHECK(+fin.payload_bytes == 0);
  CHECK(mc::finalized_frame_of(fin).collectives == 1234);

  const mc::FrameHeader beat = mc::encode(mc::HeartbeatFrame{5, 250});
  CHECK(+beat.kind == static_cast<std::uint8_t>(CollectiveKind::kHeartbeat));
  CHECK(+beat.root == 5);
  CHECK(+beat.count == 250);
  CHECK(mc::heartbeat_frame_of(beat).sender == 5);
  CHECK(mc::heartbeat_frame_of(beat).interval_ms == 250);
}
