// The pieces of device_backend.h shared by every device backend: the polled Work and its text.
#include "collective/backend/device_backend.h"

#include <cstdio>

#include "collective/backend/cuda_api.h"
#include "collective/option_values.h"
#include "common/socket.h"

namespace mwms::collective {

std::string seconds_text(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g s", seconds);
  return buf;
}

int poll_event(int (*query)(void* event), void* event, common::Deadline deadline) {
  PollBackoff backoff;
  for (;;) {
    const int q = query(event);
    if (q != kCudaErrorNotReady || common::Clock::now() > deadline) return q;
    backoff.pause();
  }
}

bool PolledDeviceWork::test() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  return look();
}

void PolledDeviceWork::wait(std::optional<double> timeout_seconds) {
  const double limit = seconds_or(timeout_seconds, timeout_, "Work::wait's timeout_seconds");
  const common::Deadline wait_deadline = common::deadline_after(limit);
  PollBackoff backoff;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (look()) {
        if (error_) std::rethrow_exception(error_);
        return;
      }
    }
    if (common::Clock::now() > wait_deadline) {
      ErrorContext ctx = ctx_;
      ctx.timeout_seconds = limit;
      throw TimeoutError("Work::wait: " + label_ + " " + ctx_.op + " seq " +
                             std::to_string(ctx_.seq) + " not complete after " +
                             seconds_text(limit) + " (it keeps running under its own deadline)",
                         ctx);
    }
    backoff.pause();
  }
}

}  // namespace mwms::collective
