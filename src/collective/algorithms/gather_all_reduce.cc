// Latency-optimal all-reduce for small messages: a ring all-gather of every rank's whole buffer
// into n slots (n-1 transfers instead of the ring's 2(n-1)), then every rank reduces the slots in
// rank order, so every rank computes bit-identical results whatever the arrival order.
#include <cstring>

#include "collective/algorithms/algorithms.h"
#include "kernels/reduce.h"

namespace mwms::collective {
namespace {

class GatherAllReduce final : public Algorithm {
 public:
  std::string_view name() const noexcept override { return "gather"; }
  AlgorithmId id() const noexcept override { return AlgorithmId::kGather; }
  CollectiveKind collective() const noexcept override { return CollectiveKind::kAllReduce; }
  bool supports(const SelectionInput& in, std::string*) const override {
    return is_all_reduce_kind(in.kind);
  }
  std::size_t scratch_bytes(const CollectiveCall& call) const override {
    return call.count * dtype_size(call.dtype) * static_cast<std::size_t>(call.world_size);
  }

  void plan(const CollectiveCall& call, Buffers, char* gather, Plan* plan) const override {
    const int n = call.world_size;
    const int r = call.rank;
    const std::size_t bytes = call.count * dtype_size(call.dtype);
    plan->reset(static_cast<std::size_t>(n - 1));
    // Step s forwards the buffer of rank r-s (step 0: our own) and receives that of rank r-s-1.
    for (int s = 0; s < n - 1; ++s) {
      Transfer& t = plan->transfers[s];
      set_send(call, t, s, wrap_rank(r + 1, n), gather + wrap_rank(r - s, n) * bytes, bytes,
               s - 1);
      set_recv(call, t, s, wrap_rank(r - 1, n), gather + wrap_rank(r - s - 1, n) * bytes, bytes,
               Finalise::kWhole, kNoGate);
    }
  }

  void stage(const CollectiveCall& call, Buffers b, char* gather) const override {
    const std::size_t bytes = call.count * dtype_size(call.dtype);
    if (bytes > 0) std::memcpy(gather + static_cast<std::size_t>(call.rank) * bytes, b.recv, bytes);
  }

  void finish(const CollectiveCall& call, Buffers b, char* gather) const override {
    const std::size_t bytes = call.count * dtype_size(call.dtype);
    if (bytes == 0) return;
    // Rank order, not arrival order: float results must not depend on who computes them.
    std::memcpy(b.recv, gather, bytes);
    for (int k = 1; k < call.world_size; ++k) {
      kernels::reduce(b.recv, gather + k * bytes, call.count, call.dtype, call.op);
    }
    if (call.op == ReduceOp::kMean) {
      kernels::scale_divide(b.recv, call.count, call.dtype, call.world_size);
    }
  }
};

}  // namespace

const Algorithm& gather_all_reduce() {
  static const GatherAllReduce instance;
  return instance;
}

}  // namespace mwms::collective
