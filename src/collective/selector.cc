#include "collective/selector.h"

#include <algorithm>

#include "collective/algorithms/algorithms.h"
#include "mwms/errors.h"

namespace mwms::collective {

namespace {

// Over shared memory the ring's pipeline wins from a few hundred KiB (n = 4, 2 cores).
constexpr std::size_t kShmRabenseifnerMaxBytes = 256 << 10;
// Over MPI links Rabenseifner's halves beat the ring's chunks up to at least 16 MiB (n = 2).
constexpr std::size_t kMpiRabenseifnerMaxBytes = std::size_t{64} << 20;
// Two ranks over MPI links: one exchange of the whole buffer beats rhd's two half steps up to here.
constexpr std::size_t kMpiPairDoublingMaxBytes = std::size_t{2} << 20;

// Note [selector thresholds]: where Rabenseifner hands over to the ring (docs/algorithms.md).
constexpr std::size_t kRabenseifnerMaxBytesPow2 = std::size_t{4} << 20;
constexpr std::size_t kRabenseifnerMaxBytes = std::size_t{1} << 20;
constexpr std::size_t kShmSmallMessageBytes = 8192;

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
  // Over shared memory alone a latency is a few microseconds and bytes are cheap to copy, so the
  // whole-buffer exchanges of recursive doubling stop paying off much earlier.
  const std::size_t small = in.topology.all_shm
                                ? std::min(options.small_message_bytes, kShmSmallMessageBytes)
                                : options.small_message_bytes;
  if (in.bytes <= small) {
    return {&recursive_doubling_all_reduce(),
            in.topology.all_shm
                ? "message at most min(MWMS_SMALL_MESSAGE_BYTES, 8 KiB) over shared memory: "
                  "recursive doubling, log2(n) latencies"
                : "message at most MWMS_SMALL_MESSAGE_BYTES: recursive doubling, log2(n) "
                  "latencies"};
  }
  if (n == 2 && in.topology.any_mpi && in.bytes <= kMpiPairDoublingMaxBytes) {
    // Two ranks over MPI: each step pays an MPI rendezvous (request, the receiver's single copy,
    // fin) and our envelope message, so one whole-buffer exchange (recursive doubling: one step,
    // half a buffer more to reduce) beats rhd's two half steps: with interleaved timing
    // (bench/all_reduce_perf --backend mpi --compare mpi, 4 runs) rd was 0.97-1.05x
    // MPI_Allreduce at 512 KiB - 2 MiB where rhd was 0.89-0.96x; at 4 MiB they tie.
    return {&recursive_doubling_all_reduce(),
            "two ranks over MPI, at most 2 MiB: recursive doubling (one exchange instead of two "
            "half steps)"};
  }
  if (n == 2 && !in.topology.any_mpi) {
    // Two ranks: Rabenseifner and the ring exchange the same halves, but the ring reduces in
    // place as chunks land and forwards them at once (measured 1.4-1.8x rhd over shm). Over MPI
    // links the halves of rhd measured 1.2-1.45x the ring at 1-16 MiB (Open MPI's single-copy
    // path pins and pulls each piece on the receiver).
    return {&ring_all_reduce(), "two ranks: ring (one reduce-scatter and one all-gather step)"};
  }
  const bool pow2 = (n & (n - 1)) == 0;
  const std::size_t rhd_max = in.topology.all_shm  ? kShmRabenseifnerMaxBytes
                              : in.topology.any_mpi ? kMpiRabenseifnerMaxBytes
                              : pow2                ? kRabenseifnerMaxBytesPow2
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
