// The list of algorithms (the only place that knows them all). Build-dependent algorithms (NCCL
// native collectives) register here behind MWMS_HAVE_* (STYLE item 4).
#include "collective/algorithms/algorithms.h"
#include "mwms/config.h"

namespace mwms::collective {

void Algorithm::finish(const CollectiveCall&, Buffers, char*) const {}
void Algorithm::stage(const CollectiveCall&, Buffers, char*) const {}

const std::vector<const Algorithm*>& all_algorithms() {
  static const std::vector<const Algorithm*> list = {
      &ring_all_reduce(),         &gather_all_reduce(),       &recursive_doubling_all_reduce(),
      &rabenseifner_all_reduce(), &ring_reduce_scatter(),     &ring_all_gather(),
      &ring_broadcast(),          &hierarchical_all_reduce(), &flat_all_reduce(),
  };
  return list;
}

const Algorithm* find_algorithm(CollectiveKind kind, AlgorithmId id) {
  CollectiveKind k = is_all_reduce_kind(kind) ? CollectiveKind::kAllReduce : kind;
  for (const Algorithm* a : all_algorithms()) {
    if (a->collective() == k && a->id() == id) return a;
  }
  return nullptr;
}

const char* algorithm_name(std::uint8_t id) noexcept {
  switch (static_cast<AlgorithmId>(id)) {
    case AlgorithmId::kRing: return "ring";
    case AlgorithmId::kGather: return "gather";
    case AlgorithmId::kRecursiveDoubling: return "rd";
    case AlgorithmId::kRabenseifner: return "rhd";
    case AlgorithmId::kHierarchical: return "hier";
    case AlgorithmId::kFlat:
      return "flat";
  }
  return "unknown";
}

}  // namespace mwms::collective
