// PlanRunner's per-run state (engine/plan_runner.cc), shared with its flat all-reduce
// (engine/flat_runner.cc): both wait with the same deadline, stall and peer checks.
#pragma once

#include <chrono>
#include <cstdint>

#include "collective/engine/plan_runner.h"
#include "common/socket.h"

namespace mwms::collective {

struct PlanRunner::State {
  int n = 0;
  int s = 0;  // send cursor (Note [plan order])
  int r = 0;  // receive cursor
  bool send_started = false;
  bool recv_started = false;
  bool recv_checked = false;
  bool notice_sent = false;
  int warns = 0;  // stall warnings since the last progress (Note [stall warning])
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  int world_size = 1;
  double timeout = 0;
  common::Clock::time_point start;
  common::Clock::time_point last_progress;
  // Progress is counted, not timed: the clock is read only when a wait finds a new count, so a
  // small collective that never waits reads it once (Note [idle time]).
  std::uint64_t progress = 0;
  std::uint64_t progress_seen = 0;
  std::uint32_t spins = 0;
  bool force_partial = false;   // reduce a partial chunk: the link may not hold a whole one
  bool stream_landing = false;  // Note [streaming copy-out] (kernels/copy.h)
};

/// Seconds since `t`.
inline double since(common::Clock::time_point t) {
  return std::chrono::duration<double>(common::Clock::now() - t).count();
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace mwms::collective
