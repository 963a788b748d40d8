// Pipelined ring broadcast from call.root: each rank forwards what has arrived while the rest is
// still coming (its send is gated on its own receive, Note [ring gating]).
#include "collective/algorithms/algorithms.h"

namespace mwms::collective {
namespace {

class RingBroadcast final : public Algorithm {
 public:
  std::string_view name() const noexcept override { return "ring"; }
  AlgorithmId id() const noexcept override { return AlgorithmId::kRing; }
  CollectiveKind collective() const noexcept override { return CollectiveKind::kBroadcast; }
  bool supports(const SelectionInput& in, std::string*) const override {
    return in.kind == CollectiveKind::kBroadcast;
  }
  std::size_t scratch_bytes(const CollectiveCall&) const override { return 0; }

  void plan(const CollectiveCall& call, Buffers b, char*, Plan* plan) const override {
    const int n = call.world_size;
    const int position = wrap_rank(call.rank - call.root, n);
    const std::size_t bytes = call.count * dtype_size(call.dtype);
    plan->reset(1);
    Transfer& t = plan->transfers[0];
    bool receives = position != 0;
    if (receives) {
      set_recv(call, t, 0, wrap_rank(call.rank - 1, n), b.recv, bytes, Finalise::kWhole, kNoGate);
    }
    if (position != n - 1) {
      set_send(call, t, 0, wrap_rank(call.rank + 1, n), b.recv, bytes, receives ? 0 : kNoGate);
    }
  }
};

}  // namespace

const Algorithm& ring_broadcast() {
  static const RingBroadcast instance;
  return instance;
}

}  // namespace mwms::collective
