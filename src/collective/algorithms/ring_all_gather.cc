// Ring all-gather: n-1 steps; step s forwards block r-s and receives block r-s-1 in place.
#include "collective/algorithms/algorithms.h"

namespace mwms::collective {
namespace {

class RingAllGather final : public Algorithm {
 public:
  std::string_view name() const noexcept override { return "ring"; }
  AlgorithmId id() const noexcept override { return AlgorithmId::kRing; }
  CollectiveKind collective() const noexcept override { return CollectiveKind::kAllGather; }
  bool supports(const SelectionInput& in, std::string*) const override {
    return in.kind == CollectiveKind::kAllGather;
  }
  std::size_t scratch_bytes(const CollectiveCall&) const override { return 0; }

  void plan(const CollectiveCall& call, Buffers b, char*, Plan* plan) const override {
    const int n = call.world_size;
    const int r = call.rank;
    const std::size_t block = (call.count / static_cast<std::size_t>(n)) * dtype_size(call.dtype);
    plan->reset(static_cast<std::size_t>(n - 1));
    for (int s = 0; s < n - 1; ++s) {
      Transfer& t = plan->transfers[s];
      // Step 0 sends our own block from the input: it is copied into place only after the run
      // (engine_backend.cc), so a refused call leaves the output as it was (Note [accept before
      // landing]).
      const char* out = s == 0 ? b.send : b.recv + wrap_rank(r - s, n) * block;
      set_send(call, t, s, wrap_rank(r + 1, n), out, block, s - 1);
      set_recv(call, t, s, wrap_rank(r - 1, n), b.recv + wrap_rank(r - s - 1, n) * block, block,
               Finalise::kWhole, kNoGate);
    }
  }
};

}  // namespace

const Algorithm& ring_all_gather() {
  static const RingAllGather instance;
  return instance;
}

}  // namespace mwms::collective
