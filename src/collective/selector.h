// Algorithm selection (STYLE item 31): an explicit function of the call and the options, with the
// reason it gives, not "first registered wins".
#pragma once

#include <cstddef>
#include <string>

#include "collective/algorithms/ring_algorithms.h"

namespace mwms::collective {

struct AllReduceChoice {
  AllReduceAlgorithm algorithm;
  const char* reason;
};

/// Gather (n-1 latency-bound steps) for messages of at most `small_message_bytes`, the ring
/// (2(n-1) steps, 2(n-1)/n of the bytes per rank) above. Depends only on values every rank shares,
/// so all ranks choose alike; frames carry the choice and a disagreement is reported.
AllReduceChoice select_all_reduce(std::size_t bytes, int world_size,
                                  std::size_t small_message_bytes);

}  // namespace mwms::collective
