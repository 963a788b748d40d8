#include "collective/selector.h"

#include "collective/algorithms/algorithms.h"
#include "mwms/errors.h"

namespace mwms::collective {

namespace {

const Algorithm* by_name(CollectiveKind kind, std::string_view name) {
  CollectiveKind k = is_all_reduce_kind(kind) ? CollectiveKind::kAllReduce : kind;
  for (const Algorithm* a : all_algorithms()) {
    if (a->collective() == k && a->name() == name) return a;
  }
  return nullptr;
}

std::string names_for(CollectiveKind kind) {
  CollectiveKind k = is_all_reduce_kind(kind) ? CollectiveKind::kAllReduce : kind;
  std::string out;
  for (const Algorithm* a : all_algorithms()) {
    if (a->collective() == k) out += (out.empty() ? "" : ", ") + std::string(a->name());
  }
  return out;
}

}  // namespace

Selection select_algorithm(const SelectionInput& in, const SelectorOptions& options) {
  if (!options.forced.empty() && options.forced != "auto") {
    const Algorithm* a = by_name(in.kind, options.forced);
    if (a == nullptr) {
      bool known = false;
      for (const Algorithm* any : all_algorithms()) known = known || any->name() == options.forced;
      if (!known) {
        throw InvalidArgument("MWMS_ALGO=" + options.forced + " names no algorithm (choose " +
                              "auto or, for " + kind_name(in.kind) + ", " + names_for(in.kind) +
                              ")");
      }
      // The forced algorithm has no variant for this collective: choose as usual below.
    } else {
      std::string why;
      if (!a->supports(in, &why)) {
        throw InvalidArgument("MWMS_ALGO=" + options.forced + " does not apply to this " +
                              kind_name(in.kind) + ": " + why);
      }
      return {a, "forced by MWMS_ALGO"};
    }
  }
  if (!is_all_reduce_kind(in.kind)) {
    return {by_name(in.kind, "ring"), "the only algorithm for this collective"};
  }
  if (in.topology.world_size <= 1) return {&ring_all_reduce(), "world size 1: nothing to move"};
  if (in.bytes <= options.small_message_bytes) {
    // Latency-bound: n-1 message latencies instead of 2(n-1); the extra bytes do not matter yet.
    return {&gather_all_reduce(), "message at most MWMS_SMALL_MESSAGE_BYTES"};
  }
  return {&ring_all_reduce(), "bandwidth-bound message"};
}

}  // namespace mwms::collective
