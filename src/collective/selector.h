// Algorithm selection (STYLE item 31): an explicit function of the call, the topology and the
// options, returning the algorithm and the reason it gives (logged under COLL at debug), not
// "first registered wins". Depends only on values every rank shares, so all ranks choose alike;
// frames carry the choice and a disagreement is reported as CollectiveMismatchError.
#pragma once

#include <cstddef>
#include <string>

#include "collective/algorithms/algorithm.h"

namespace mwms::collective {

struct SelectorOptions {
  // MWMS_ALGO or CommunicatorOptions::algorithm: "" or "auto" = choose; else a name.
  std::string forced;
  // MWMS_SMALL_MESSAGE_BYTES: all-reduces up to this size take the latency-optimal algorithm
  // (recursive doubling).
  std::size_t small_message_bytes = 65536;
};

struct Selection {
  const Algorithm* algorithm = nullptr;
  const char* reason = "";  // static text: selecting allocates nothing
};

/// Checks a forced algorithm name ("" and "auto" choose): @throws InvalidArgument naming every
/// algorithm and the collectives it serves when `name` is none of them.
void check_algorithm_name(const std::string& name);

/// Picks the algorithm for `in`. @throws InvalidArgument when `options.forced` names no
/// algorithm, or one that does not apply to `in` (saying why and which names do).
Selection select_algorithm(const SelectionInput& in, const SelectorOptions& options);

}  // namespace mwms::collective
