#include "collective/selector.h"

namespace mwms::collective {

AllReduceChoice select_all_reduce(std::size_t bytes, int world_size,
                                  std::size_t small_message_bytes) {
  if (world_size <= 1) return {AllReduceAlgorithm::kRing, "world size 1: nothing to move"};
  if (bytes <= small_message_bytes) {
    // Latency-bound: n-1 message latencies instead of 2(n-1); the extra bytes do not matter yet.
    return {AllReduceAlgorithm::kGather, "message at most MWMS_SMALL_MESSAGE_BYTES"};
  }
  return {AllReduceAlgorithm::kRing, "bandwidth-bound message"};
}

}  // namespace mwms::collective
