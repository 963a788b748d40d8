#include "common/statistics.h"

#include <algorithm>
#include <numeric>

namespace mwms::bench {

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  const std::size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(mid), values.end());
  double upper = values[mid];
  if (values.size() % 2 == 1) return upper;
  double lower = *std::max_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(mid));
  return (lower + upper) / 2;
}

double mean(const std::vector<double>& values) {
  if (values.empty()) return 0;
  return std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(values.size());
}

double gb_per_s(double bytes, double time_us) {
  if (time_us <= 0) return 0;
  return bytes / (time_us * 1e-6) / 1e9;
}

}  // namespace mwms::bench
