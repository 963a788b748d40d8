#include "collective/selector.h"

#include <algorithm>

#include "collective/algorithms/algorithms.h"
#include "mwms/errors.h"

namespace mwms::collective {

namespace {

// Note [selector thresholds]: where Rabenseifner hands over to the ring (docs/algorithms.md).
constexpr std::size_t kRabenseifnerMaxBytesPow2 = std::size_t{4} << 20;
constexpr std::size_t kRabenseifnerMaxBytes = std::size_t{1} << 20;

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

void check_algorithm_name(const std::string& name) {
  if (name.empty() || name == "auto") return;
  std::string all;
  for (const Algorithm* a : all_algorithms()) {
    if (a->name() == name) return;
  }
  for (CollectiveKind k : {CollectiveKind::kAllReduce, CollectiveKind::kReduceScatter,
                           CollectiveKind::kAllGather, CollectiveKind::kBroadcast}) {
    all += std::string(all.empty() ? "" : "; ") + kind_name(k) + ": " + names_for(k);
  }
  throw InvalidArgument("algorithm " + name + " (MWMS_ALGO or CommunicatorOptions::algorithm) "
                        "names no algorithm; choose auto or one of " + all);
}

Selection select_algorithm(const SelectionInput& in, const SelectorOptions& options) {
  if (!options.forced.empty() && options.forced != "auto") {
    const Algorithm* a = by_name(in.kind, options.forced);
    if (a == nullptr) {
      bool known = false;
      for (const Algorithm* any : all_algorithms()) known = known || any->name() == options.forced;
      if (!known) {
        throw InvalidArgument("algorithm " + options.forced + " (MWMS_ALGO or " +
                              "CommunicatorOptions::algorithm) names no algorithm (choose auto " +
                              "or, for " + kind_name(in.kind) + ", " + names_for(in.kind) + ")");
      }
      // The forced algorithm has no variant for this collective: choose as usual below.
    } else {
      std::string why;
      if (!a->supports(in, &why)) {
        throw InvalidArgument("algorithm " + options.forced + " (MWMS_ALGO or " +
                              "CommunicatorOptions::algorithm): " + options.forced +
                              " does not apply to this " + kind_name(in.kind) + ": " + why);
      }
      return {a, "forced by MWMS_ALGO or CommunicatorOptions::algorithm"};
    }
  }
  if (!is_all_reduce_kind(in.kind)) {
    return {by_name(in.kind, "ring"), "the only algorithm for this collective"};
  }
  const int n = in.topology.world_size;
  if (n <= 1) return {&ring_all_reduce(), "world size 1: nothing to move"};
  // Note [selector thresholds], measured with all_reduce_perf (docs/algorithms.md): up to
  // MWMS_SMALL_MESSAGE_BYTES recursive doubling has the fewest message latencies (log2 n, and
  // the extra bytes do not matter yet); Rabenseifner moves the ring's bytes in 2 log2 n steps,
  // which wins up to a few MiB; beyond that the ring's deeper pipeline wins. A world size that
  // is not a power of two costs Rabenseifner 2 x S more on the folded pairs, so the ring takes
  // over earlier there.
  // The links' own thresholds (LinkTuning, from their transport's table entry): over shared memory a
  // latency is a few microseconds and bytes are cheap to copy, so the whole-buffer exchanges of
  // recursive doubling stop paying off much earlier there.
  const LinkTuning& links = in.topology.links;
  if (in.bytes <= std::min(options.small_message_bytes, links.flat_max_bytes) &&
      flat_all_reduce().supports(in, nullptr)) {
    // Note [flat all-reduce]: one step, every rank reads every rank's slot where it lies.
    return {&flat_all_reduce(),
            "message at most the links' flat limit (and MWMS_SMALL_MESSAGE_BYTES), ranks sharing "
            "memory: flat (each rank publishes its slot, every rank reduces all slots)"};
  }
  if (in.topology.ranks_exceed_cores && in.bytes <= links.flat_oversubscribed_max_bytes &&
      flat_all_reduce().supports(in, nullptr)) {
    return {&flat_all_reduce(),
            "more ranks than cores on the host, ranks sharing memory: flat (two hand-offs, "
            "staged above its lines, against 2 log2(n) or 2(n-1) for rhd and the ring)"};
  }
  if (in.bytes <= std::min(options.small_message_bytes, links.small_message_max_bytes)) {
    return {&recursive_doubling_all_reduce(),
            links.small_message_max_bytes < options.small_message_bytes
                ? "message at most the links' small-message limit (below "
                  "MWMS_SMALL_MESSAGE_BYTES): recursive doubling, log2(n) latencies"
                : "message at most MWMS_SMALL_MESSAGE_BYTES: recursive doubling, log2(n) "
                  "latencies"};
  }
  if (n == 2 && in.bytes <= links.pair_exchange_max_bytes) {
    // Links that pay a rendezvous per message (MPI: request, the receiver's single copy, fin)
    // plus our envelope message: one whole-buffer exchange (recursive doubling: one step, half a
    // buffer more to reduce) beats rhd's two half steps (Note [mpi tuning] in transport/mpi/mpi_entry.cc).
    return {&recursive_doubling_all_reduce(),
            "two ranks, at most the links' pair-exchange limit: recursive doubling (one "
            "exchange instead of two half steps)"};
  }
  if (n == 2 && links.two_rank_ring) {
    // Two ranks: Rabenseifner and the ring exchange the same halves, but the ring reduces in
    // place as chunks land and forwards them at once (measured 1.4-1.8x rhd over shm).
    return {&ring_all_reduce(), "two ranks: ring (one reduce-scatter and one all-gather step)"};
  }
  const bool pow2 = (n & (n - 1)) == 0;
  const std::size_t rhd_max = links.rabenseifner_max_bytes > 0 ? links.rabenseifner_max_bytes
                              : pow2                            ? kRabenseifnerMaxBytesPow2
                                                                : kRabenseifnerMaxBytes;
  if (in.bytes <= rhd_max) {
    return {&rabenseifner_all_reduce(),
            pow2 ? "medium message: Rabenseifner, ring bytes in 2 log2(n) steps"
                 : "medium message: Rabenseifner (world size not a power of two)"};
  }
  if (hierarchical_all_reduce().supports(in, nullptr)) {
    // Note [hierarchical bytes]: between hosts, a host sends 2(H-1)/H of the buffer instead of
    // the flat ring's 2(n-1)/n on each host-crossing ring link.
    return {&hierarchical_all_reduce(),
            "large message, several hosts with the same number of ranks: hierarchical "
            "(reduce-scatter inside each host, all-reduce across hosts, all-gather inside)"};
  }
  return {&ring_all_reduce(), "large message: ring (deepest pipeline)"};
}

}  // namespace mwms::collective
