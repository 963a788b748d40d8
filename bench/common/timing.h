// Wall-clock timing of one iteration. steady_clock: immune to NTP steps; on Linux it reads
// CLOCK_MONOTONIC through the vDSO, well under a microsecond, so it can bracket each iteration.
#pragma once

#include <chrono>
#include <cstddef>
#include <vector>

namespace mwms::bench {

class Stopwatch {
 public:
  Stopwatch() : start_(std::chrono::steady_clock::now()) {}
  /// Microseconds since construction.
  double elapsed_us() const {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start_)
        .count();
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

/// Runs `fn` `iters` times and stores each iteration's time in `times_us` (resized to iters).
template <typename Fn>
void time_iterations(int iters, std::vector<double>& times_us, Fn&& fn) {
  times_us.resize(static_cast<std::size_t>(iters));
  for (int i = 0; i < iters; ++i) {
    Stopwatch watch;
    fn();
    times_us[static_cast<std::size_t>(i)] = watch.elapsed_us();
  }
}

}  // namespace mwms::bench
