// The flat all-reduce for small messages between the ranks of one host (issue 18, item 2).
//
// Note [flat all-reduce]: every rank copies its contribution into its own flat area (Note [flat
// slots], transport/link.h), which its peers map, and publishes it by storing the call's number
// k there last; then it reads every rank's contribution where it lies, in rank order (so every
// rank computes bit-identical results, as gather does), waiting for each one's k. One cache
// line moves from each rank to each peer for a message of up to 48 bytes, against an envelope, a
// payload and the ring's head and tail lines per message of recursive doubling's log2(n) steps;
// there is no queue, no syscall, no allocation and no lock on the way (a doorbell is rung only
// when a peer sleeps). Two sets per area, used by odd and even k, make it safe to overwrite one
// without waiting for readers: a rank starts call k only after every rank published k - 1, which
// each did only after it had read everything of k - 2, the last call in that set. Calls are
// numbered per communicator by the runner, so the number is the same on every rank as long as
// the ranks call the same collectives; what they called is in the set's header and checked
// (Note [flat mismatch], engine/flat_runner.cc). This is the "each rank writes its own cache-line
// slot, every rank reduces all slots" scheme of shared-memory MPI collectives; the selector takes
// it over shared memory up to the links' flat_max_bytes (LinkTuning) and at most kFlatMaxRanks
// ranks, beyond which each rank's n - 1 reads of every slot stop being cheaper than rd's rounds.
#include "collective/algorithms/algorithms.h"
#include "collective/flat_layout.h"
#include "mwms/errors.h"

namespace mwms::collective {
namespace {

constexpr int kFlatMaxRanks = 16;
static_assert(kFlatStageBytes == 1 << 20, "the refusal below names the size");

class FlatAllReduce final : public Algorithm {
 public:
  std::string_view name() const noexcept override { return "flat"; }
  AlgorithmId id() const noexcept override { return AlgorithmId::kFlat; }
  CollectiveKind collective() const noexcept override { return CollectiveKind::kAllReduce; }
  bool supports(const SelectionInput& in, std::string* why) const override {
    const char* no = nullptr;
    if (!is_all_reduce_kind(in.kind)) {
      no = "flat is an all-reduce";
    } else if (!in.topology.links.flat_slots) {
      no = "the links offer no flat slots (only shared memory between the ranks of one host, "
           "with every pair on it, does)";
    } else if (in.bytes > kFlatStageBytes) {
      no = "the message is larger than a flat staging set (1 MiB)";
    } else if (in.topology.world_size > kFlatMaxRanks) {
      no = "more than 16 ranks";
    }
    if (no != nullptr && why != nullptr) *why = no;
    return no == nullptr;
  }
  std::size_t scratch_bytes(const CollectiveCall&) const override { return 0; }
  void plan(const CollectiveCall&, Buffers, char*, Plan* plan) const override {
    plan->reset(0);  // never run: flat() sends the engine to PlanRunner::run_flat
  }
  bool flat() const noexcept override { return true; }
};

}  // namespace

const Algorithm& flat_all_reduce() {
  static const FlatAllReduce instance;
  return instance;
}

}  // namespace mwms::collective
