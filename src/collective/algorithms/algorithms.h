// The algorithms of this build, one per file (STYLE item 2); registry.cc lists them.
#pragma once

#include "collective/algorithms/algorithm.h"

namespace mwms::collective {

const Algorithm& ring_all_reduce();
const Algorithm& gather_all_reduce();
const Algorithm& recursive_doubling_all_reduce();
const Algorithm& rabenseifner_all_reduce();
const Algorithm& hierarchical_all_reduce();
const Algorithm& flat_all_reduce();
const Algorithm& ring_reduce_scatter();
const Algorithm& ring_all_gather();
const Algorithm& ring_broadcast();

/// True for the kinds that run all-reduce algorithms (all-reduce, barrier).
inline bool is_all_reduce_kind(CollectiveKind k) {
  return k == CollectiveKind::kAllReduce || k == CollectiveKind::kBarrier;
}

}  // namespace mwms::collective
