#include "strategy/buckets.h"

namespace mwms::strategy {

bool adjacent_tensors(const TensorRef& a, const TensorRef& b) noexcept {
  return static_cast<const char*>(a.data) + a.count * dtype_size(a.dtype) == b.data;
}

std::vector<BucketSpan> plan_buckets(const std::vector<TensorRef>& tensors,
                                     std::size_t bytes_per_pack, std::size_t solo_bytes) {
  std::vector<BucketSpan> out;
  std::size_t first = 0;
  while (first < tensors.size()) {
    std::size_t last = first + 1;
    std::size_t bytes = tensors[first].count * dtype_size(tensors[first].dtype);
    while (last < tensors.size() && tensors[last].dtype == tensors[first].dtype) {
      const std::size_t more = tensors[last].count * dtype_size(tensors[last].dtype);
      if (bytes + more > bytes_per_pack) break;
      if ((bytes >= solo_bytes || more >= solo_bytes) &&
          !adjacent_tensors(tensors[last - 1], tensors[last])) {
        break;
      }
      bytes += more;
      ++last;
    }
    out.push_back({first, last, bytes});
    first = last;
  }
  return out;
}

}  // namespace mwms::strategy
