#include "common/gradients.h"

#include <algorithm>
#include <string>

#include "mwms/errors.h"

namespace mwms::bench {

std::vector<std::size_t> model_like_counts(std::size_t tensors, std::size_t total_bytes,
                                           std::size_t elem_bytes) {
  if (tensors == 0 || elem_bytes == 0) {
    throw InvalidArgument("model_like_counts: tensors " + std::to_string(tensors) +
                          " and element size " + std::to_string(elem_bytes) + " must be > 0");
  }
  const std::size_t total = total_bytes / elem_bytes;
  if (total < tensors) {
    throw InvalidArgument("gradient size " + std::to_string(total_bytes) + " B holds " +
                          std::to_string(total) + " elements of " + std::to_string(elem_bytes) +
                          " B, fewer than the " + std::to_string(tensors) +
                          " tensors (each needs at least one)");
  }
  const std::size_t layers = (tensors + 1) / 2;
  const auto channels = [&](std::size_t j) -> std::size_t {
    return std::size_t{64} << std::min<std::size_t>(4, 4 * j / layers);
  };
  std::vector<std::size_t> counts(tensors, 0);
  std::vector<double> weight_shape(tensors, 0);  // relative size of each weight; 0 for biases
  std::size_t bias_total = 0;
  for (std::size_t t = 0; t < tensors; ++t) {
    const std::size_t j = t / 2;
    if (t % 2 == 1) {
      counts[t] = channels(j);
      bias_total += counts[t];
    } else {
      const double k = j % 4 == 3 ? 1.0 : 3.0;
      const double in = static_cast<double>(j == 0 ? 3 : channels(j - 1));
      weight_shape[t] = static_cast<double>(channels(j)) * in * k * k;
    }
  }
  // The biases take at most a quarter of the budget (tiny totals), each at least one element.
  const std::size_t bias_budget = total / 4;
  if (bias_total > bias_budget) {
    const double scale = static_cast<double>(bias_budget) / static_cast<double>(bias_total);
    bias_total = 0;
    for (std::size_t t = 1; t < tensors; t += 2) {
      counts[t] = std::max<std::size_t>(
          1, static_cast<std::size_t>(static_cast<double>(counts[t]) * scale));
      bias_total += counts[t];
    }
  }
  // The weights share the rest in proportion to their shapes (floored, at least one element);
  // the largest weight absorbs the rounding so that the total is exact.
  const std::size_t weights_budget = total - bias_total;
  double shape_sum = 0;
  for (double w : weight_shape) shape_sum += w;
  std::size_t assigned = bias_total;
  std::size_t largest = 0;
  for (std::size_t t = 0; t < tensors; t += 2) {
    counts[t] =
        std::max<std::size_t>(1, static_cast<std::size_t>(weight_shape[t] / shape_sum *
                                                          static_cast<double>(weights_budget)));
    assigned += counts[t];
    if (counts[t] > counts[largest]) largest = t;
  }
  if (assigned <= total) {
    counts[largest] += total - assigned;
  } else {
    // Only when the at-least-one rule overshot: take the excess from the largest tensors.
    std::size_t excess = assigned - total;
    while (excess > 0) {
      const auto it = std::max_element(counts.begin(), counts.end());
      const std::size_t take = std::min(excess, *it - 1);
      if (take == 0) break;  // unreachable: total >= tensors leaves room
      *it -= take;
      excess -= take;
    }
  }
  return counts;
}

std::size_t count_buckets(const std::vector<std::size_t>& tensor_bytes,
                          std::size_t bytes_per_pack) {
  std::size_t buckets = 0;
  std::size_t first = 0;
  while (first < tensor_bytes.size()) {
    std::size_t bytes = tensor_bytes[first];
    std::size_t last = first + 1;
    while (last < tensor_bytes.size() && bytes + tensor_bytes[last] <= bytes_per_pack) {
      bytes += tensor_bytes[last];
      ++last;
    }
    ++buckets;
    first = last;
  }
  return buckets;
}

}  // namespace mwms::bench
