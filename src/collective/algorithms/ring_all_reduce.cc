// Ring all-reduce (Patarasuk & Yuan 2009; NCCL's ring): n-1 reduce-scatter steps then n-1
// all-gather steps over the ring rank -> rank+1. Per rank it moves 2(n-1)/n of the buffer
// (busbw = algbw * 2(n-1)/n). Note [ring segments] in plan.h; Note [ring gating] lets step s+1
// forward what step s has reduced while step s is still receiving.
#include "collective/algorithms/algorithms.h"
#include "mwms/types.h"

namespace mwms::collective {
namespace {

class RingAllReduce final : public Algorithm {
 public:
  std::string_view name() const noexcept override { return "ring"; }
  AlgorithmId id() const noexcept override { return AlgorithmId::kRing; }
  CollectiveKind collective() const noexcept override { return CollectiveKind::kAllReduce; }
  bool supports(const SelectionInput& in, std::string*) const override {
    return is_all_reduce_kind(in.kind);
  }
  std::size_t scratch_bytes(const CollectiveCall& call) const override {
    return ring_segment(call.count, call.world_size, 0).count * dtype_size(call.dtype);
  }

  void plan(const CollectiveCall& call, Buffers b, char* scratch, Plan* plan) const override {
    const int n = call.world_size;
    const int r = call.rank;
    const int next = wrap_rank(r + 1, n);
    const int prev = wrap_rank(r - 1, n);
    const std::size_t esize = dtype_size(call.dtype);
    char* buffer = b.recv;
    plan->reset(static_cast<std::size_t>(2 * (n - 1)));
    // Reduce-scatter: step s sends segment r-s, receives segment r-s-1 and reduces it into place.
    for (int s = 0; s < n - 1; ++s) {
      Segment out = ring_segment(call.count, n, wrap_rank(r - s, n));
      Segment in = ring_segment(call.count, n, wrap_rank(r - s - 1, n));
      Transfer& t = plan->transfers[s];
      set_send(call, t, s, next, buffer + out.offset * esize, out.count * esize, s - 1);
      set_recv(call, t, s, prev, scratch, in.count * esize, Finalise::kInChunks, kNoGate);
      t.recv_must_land = false;  // only the reduction reads it
      ChunkAction& a = plan->actions[s];
      a.accumulate_into = buffer + in.offset * esize;
      a.scale = call.op == ReduceOp::kMean && s == n - 2;  // segment r+1 is complete here
    }
    // All-gather: step s sends segment r-s+1, receives segment r-s straight into place.
    for (int s = 0; s < n - 1; ++s) {
      int ti = n - 1 + s;
      Segment out = ring_segment(call.count, n, wrap_rank(r - s + 1, n));
      Segment in = ring_segment(call.count, n, wrap_rank(r - s, n));
      Transfer& t = plan->transfers[ti];
      set_send(call, t, ti, next, buffer + out.offset * esize, out.count * esize, ti - 1);
      set_recv(call, t, ti, prev, buffer + in.offset * esize, in.count * esize, Finalise::kWhole,
               kNoGate);
    }
  }
};

}  // namespace

const Algorithm& ring_all_reduce() {
  static const RingAllReduce instance;
  return instance;
}

}  // namespace mwms::collective
