// Hierarchical all-reduce for ranks that share hosts (Horovod's hierarchical allreduce; NCCL's
// and BlueConnect's split of a ring into an intra-node and an inter-node level): with H hosts of
// L ranks each,
//   A. a ring reduce-scatter among the L ranks of each host (shared memory): local rank l ends
//      with segment (l + 1) % L of the buffer reduced over its host;
//   B. a ring all-reduce of that segment among the H ranks with the same local index, one per
//      host (the links between hosts): reduce-scatter then all-gather of its H sub-segments;
//   C. a ring all-gather of the L segments among the ranks of each host.
// Every rank moves the flat ring's bytes inside its host, but between hosts a host sends
// 2(H-1)/H of the buffer in all instead of the flat ring's 2(n-1)/n per cross-host ring link
// (Note [hierarchical bytes]); every element is reduced by the same ranks in the same order on
// every rank, so the results are byte-identical.
//
// Note [hierarchical gating]: phase B's first send waits for all of A's last receive (the whole
// segment is reduced; send_gate_whole, since it sends one sub-segment, not a prefix), and C's
// first send for all of B's last receive (the receive cursor finalises in plan order, so every
// earlier receive is done too). Within a phase, sends are gated on the previous step's receive
// as in the ring (Note [ring gating]). No receive needs a recv_gate: like the ring's, every
// receive into the buffer brings a value that already includes what this rank's own earlier
// send of that region carried, so that send has completed (data dependency). Scratch is reused
// from one receive to the next as the runner finalises receives in order.
//
// Note [hierarchical bytes]: 2 hosts x 2 ranks, S bytes: the flat ring's two host-crossing links
// each carry 3/4 S per reduce-scatter and all-gather, 1.5 S per host; here 2 ranks per host each
// send S/2 across: S per host.
#include "collective/algorithms/algorithms.h"
#include "common/logging.h"
#include "mwms/types.h"

namespace mwms::collective {
namespace {

class HierarchicalAllReduce final : public Algorithm {
 public:
  std::string_view name() const noexcept override { return "hier"; }
  AlgorithmId id() const noexcept override { return AlgorithmId::kHierarchical; }
  CollectiveKind collective() const noexcept override { return CollectiveKind::kAllReduce; }
  bool supports(const SelectionInput& in, std::string* why) const override {
    if (!is_all_reduce_kind(in.kind)) return false;
    const Topology& t = in.topology;
    if (t.num_hosts < 2 || t.max_ranks_per_host < 2 || !t.uniform_hosts) {
      if (why != nullptr) {
        *why = "hierarchical all-reduce needs several hosts with the same number (> 1) of ranks "
               "each; this job has " + std::to_string(t.num_hosts) + " host(s), at most " +
               std::to_string(t.max_ranks_per_host) + " rank(s) per host" +
               (t.uniform_hosts ? "" : ", not the same number on every host");
      }
      return false;
    }
    return true;
  }
  std::size_t scratch_bytes(const CollectiveCall& call) const override {
    const int l = call.hosts != nullptr && call.hosts->ranks_per_host > 0
                      ? call.hosts->ranks_per_host
                      : 1;
    return ring_segment(call.count, l, 0).count * dtype_size(call.dtype);
  }

  void plan(const CollectiveCall& call, Buffers b, char* scratch, Plan* plan) const override {
    MWMS_CHECK(call.hosts != nullptr && call.hosts->ranks_per_host > 0 &&
                   static_cast<int>(call.hosts->host_of.size()) == call.world_size,
               "hierarchical all-reduce without a uniform host layout");
    const HostLayout& hl = *call.hosts;
    const int H = hl.num_hosts;
    const int L = hl.ranks_per_host;
    const int r = call.rank;
    const int h = hl.host_of[static_cast<std::size_t>(r)];
    const int l = hl.local_index[static_cast<std::size_t>(r)];
    const int next_local = hl.member(h, wrap_rank(l + 1, L));
    const int prev_local = hl.member(h, wrap_rank(l - 1, L));
    const int next_host = hl.member(wrap_rank(h + 1, H), l);
    const int prev_host = hl.member(wrap_rank(h - 1, H), l);
    const std::size_t esize = dtype_size(call.dtype);
    char* buffer = b.recv;
    const int a_steps = L - 1;
    const int b_steps = 2 * (H - 1);
    plan->reset(static_cast<std::size_t>(2 * a_steps + b_steps));
    int ti = 0;
    // A: reduce-scatter inside the host; step s sends segment l-s, reduces segment l-s-1.
    for (int s = 0; s < a_steps; ++s, ++ti) {
      Segment out = ring_segment(call.count, L, wrap_rank(l - s, L));
      Segment in = ring_segment(call.count, L, wrap_rank(l - s - 1, L));
      Transfer& t = plan->transfers[static_cast<std::size_t>(ti)];
      set_send(call, t, ti, next_local, buffer + out.offset * esize, out.count * esize, ti - 1);
      set_recv(call, t, ti, prev_local, scratch, in.count * esize, Finalise::kInChunks, kNoGate);
      t.recv_must_land = false;  // only the reduction reads it
      plan->actions[static_cast<std::size_t>(ti)].accumulate_into = buffer + in.offset * esize;
    }
    // B: all-reduce of segment (l+1) % L across hosts, a ring over its H sub-segments.
    const Segment seg = ring_segment(call.count, L, wrap_rank(l + 1, L));
    char* base = buffer + seg.offset * esize;
    for (int s = 0; s < H - 1; ++s, ++ti) {
      Segment out = ring_segment(seg.count, H, wrap_rank(h - s, H));
      Segment in = ring_segment(seg.count, H, wrap_rank(h - s - 1, H));
      Transfer& t = plan->transfers[static_cast<std::size_t>(ti)];
      set_send(call, t, ti, next_host, base + out.offset * esize, out.count * esize, ti - 1);
      if (s == 0) t.send_gate_whole = true;  // Note [hierarchical gating]
      set_recv(call, t, ti, prev_host, scratch, in.count * esize, Finalise::kInChunks, kNoGate);
      t.recv_must_land = false;
      ChunkAction& a = plan->actions[static_cast<std::size_t>(ti)];
      a.accumulate_into = base + in.offset * esize;
      a.scale = call.op == ReduceOp::kMean && s == H - 2;  // sub-segment h+1 is complete here
    }
    for (int s = 0; s < H - 1; ++s, ++ti) {
      Segment out = ring_segment(seg.count, H, wrap_rank(h - s + 1, H));
      Segment in = ring_segment(seg.count, H, wrap_rank(h - s, H));
      Transfer& t = plan->transfers[static_cast<std::size_t>(ti)];
      set_send(call, t, ti, next_host, base + out.offset * esize, out.count * esize, ti - 1);
      set_recv(call, t, ti, prev_host, base + in.offset * esize, in.count * esize, Finalise::kWhole,
               kNoGate);
    }
    // C: all-gather inside the host; step s sends segment l-s+1, receives segment l-s in place.
    for (int s = 0; s < a_steps; ++s, ++ti) {
      Segment out = ring_segment(call.count, L, wrap_rank(l - s + 1, L));
      Segment in = ring_segment(call.count, L, wrap_rank(l - s, L));
      Transfer& t = plan->transfers[static_cast<std::size_t>(ti)];
      set_send(call, t, ti, next_local, buffer + out.offset * esize, out.count * esize, ti - 1);
      if (s == 0) t.send_gate_whole = true;  // all of B has landed
      set_recv(call, t, ti, prev_local, buffer + in.offset * esize, in.count * esize,
               Finalise::kWhole, kNoGate);
    }
  }
};

}  // namespace

const Algorithm& hierarchical_all_reduce() {
  static const HierarchicalAllReduce instance;
  return instance;
}

}  // namespace mwms::collective
