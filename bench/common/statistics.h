// Summary statistics of per-iteration times. We quote medians, not nccl-tests' means: on a shared
// machine one descheduled iteration moves the mean by more than the effect being measured.
#pragma once

#include <vector>

namespace mwms::bench {

/// Median of `values` (mean of the two middle values for an even count); 0 for an empty vector.
/// Takes a copy because it reorders.
double median(std::vector<double> values);

/// Arithmetic mean; 0 for an empty vector.
double mean(const std::vector<double>& values);

/// Bandwidth in GB/s (1e9 bytes per second) of moving `bytes` in `time_us`; 0 when time is 0.
double gb_per_s(double bytes, double time_us);

}  // namespace mwms::bench
