// Ring reduce-scatter (NCCL semantics: rank r ends with the reduction of block r): n-1 steps;
// step s forwards the partial of block r-s-1 and receives the partial of block r-s-2 into
// alternating scratch halves, adding this rank's input; the last step yields block r.
#include "collective/algorithms/algorithms.h"

namespace mwms::collective {
namespace {

class RingReduceScatter final : public Algorithm {
 public:
  std::string_view name() const noexcept override { return "ring"; }
  AlgorithmId id() const noexcept override { return AlgorithmId::kRing; }
  CollectiveKind collective() const noexcept override { return CollectiveKind::kReduceScatter; }
  bool supports(const SelectionInput& in, std::string*) const override {
    return in.kind == CollectiveKind::kReduceScatter;
  }
  std::size_t scratch_bytes(const CollectiveCall& call) const override {
    return 2 * block_bytes(call);
  }

  void plan(const CollectiveCall& call, Buffers b, char* scratch, Plan* plan) const override {
    const int n = call.world_size;
    const int r = call.rank;
    const std::size_t block = block_bytes(call);
    char* bufs[2] = {scratch, scratch + block};
    plan->reset(static_cast<std::size_t>(n - 1));
    for (int s = 0; s < n - 1; ++s) {
      int out_block = wrap_rank(r - s - 1, n);
      int in_block = wrap_rank(r - s - 2, n);
      Transfer& t = plan->transfers[s];
      const char* src = s == 0 ? b.send + out_block * block : bufs[(s - 1) % 2];
      set_send(call, t, s, wrap_rank(r + 1, n), src, block, s - 1);
      set_recv(call, t, s, wrap_rank(r - 1, n), bufs[s % 2], block, Finalise::kInChunks,
               s >= 2 ? s - 1 : kNoGate);
      ChunkAction& a = plan->actions[s];
      a.operand = b.send + in_block * block;
      if (s == n - 2) {
        a.copy_to = b.recv;
        a.scale = call.op == ReduceOp::kMean;
      }
    }
  }

 private:
  static std::size_t block_bytes(const CollectiveCall& call) {
    return (call.count / static_cast<std::size_t>(call.world_size)) * dtype_size(call.dtype);
  }
};

}  // namespace

const Algorithm& ring_reduce_scatter() {
  static const RingReduceScatter instance;
  return instance;
}

}  // namespace mwms::collective
