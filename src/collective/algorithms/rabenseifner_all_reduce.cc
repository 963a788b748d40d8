// Rabenseifner's all-reduce (Rabenseifner 2004; Thakur, Rabenseifner & Gropp 2005, section
// 4.4): a reduce-scatter by recursive halving, then an all-gather by recursive doubling, among
// p = the largest power of two <= n ranks. The buffer is cut into p segments (Note [ring
// segments]); in halving step k = 0 .. log2(p)-1 rank r exchanges with r ^ (p >> (k+1)): of the
// range of segments it still reduces, it sends one half and folds the partner's copy of the other
// half into its own, so after log2(p) steps it holds the full reduction of segment r. The
// all-gather mirrors the halving (distances 1, 2, .. p/2), each step swapping everything gathered
// so far. Per rank (n = p): 2 (p-1)/p x S bytes, like the ring, in 2 log2(p) message latencies
// instead of 2(n-1): the algorithm for medium messages and, where it measures faster, large ones.
// Non-powers of two: the n - p extra ranks r >= p hand their whole buffer to r - p, which folds
// it in first and sends the result back at the end (2 x S more for those pairs).
//
// Note [canonical operand order] (recursive_doubling_all_reduce.cc) holds here too: the pre-step
// computes op(X_q, X_{q+p}), a halving step op(partial of the lower-ranked block, partial of the
// higher-ranked block). Each segment is reduced by exactly one rank (its owner) and then only
// copied, so every rank ends with the same bytes; kMean divides each segment once, in the owner's
// last halving step.
//
// Note [rhd buffers]: the partial of the range a rank still reduces lives at its own offsets in
// either U (the user's buffer) or F (a full-size scratch buffer). In a halving step the sent half
// and the kept half are disjoint, so:
//  - the lower partner (keeps the lower half) accumulates the received bytes, landed in the
//    scratch landing area L, into the kept half where it lies;
//  - the higher partner must compute op(received, own): it lands the received half in the other
//    buffer (whose bytes of that range are dead and were never sent) with its own as the operand,
//    and the partial moves there.
// The last halving step leaves segment r in U (landing there, or copy_to). All-gather receives
// land in U straight away: they cover ranges this rank sent in the halving, which the peer only
// sends back after consuming them, and recv_gate makes that explicit. Sends are gated on the step
// that produced their bytes: prefix-wise where the sent range begins that step's payload, whole
// otherwise.
#include "collective/algorithms/algorithms.h"
#include "mwms/types.h"

namespace mwms::collective {
namespace {

class RabenseifnerAllReduce final : public Algorithm {
 public:
  std::string_view name() const noexcept override { return "rhd"; }
  AlgorithmId id() const noexcept override { return AlgorithmId::kRabenseifner; }
  CollectiveKind collective() const noexcept override { return CollectiveKind::kAllReduce; }
  // Correct for every size and world size (count < p leaves some segments empty).
  bool supports(const SelectionInput& in, std::string* why) const override {
    if (is_all_reduce_kind(in.kind)) return true;
    if (why != nullptr) *why = "Rabenseifner's algorithm is an all-reduce algorithm";
    return false;
  }
  std::size_t scratch_bytes(const CollectiveCall& call) const override {
    const std::size_t esize = dtype_size(call.dtype);
    const int p = floor_pow2(call.world_size);
    // F (full size) and L (the largest half a lower partner receives: the first half).
    return call.count * esize + ring_segment(call.count, p, p / 2).offset * esize;
  }

  void plan(const CollectiveCall& call, Buffers b, char* scratch, Plan* plan) const override {
    const int n = call.world_size;
    const int r = call.rank;
    const int p = floor_pow2(n);
    const int steps = log2_of(p);
    const int extra = n - p;
    const std::size_t esize = dtype_size(call.dtype);
    const std::size_t bytes = call.count * esize;
    char* user = b.recv;
    if (r >= p) {  // an extra rank: hand the buffer over, get the result back
      plan->reset(2);
      set_send(call, plan->transfers[0], 0, r - p, user, bytes, kNoGate);
      set_recv(call, plan->transfers[1], 2 * steps + 1, r - p, user, bytes, Finalise::kWhole, 0);
      return;
    }
    char* full = scratch;
    char* landing = scratch + bytes;
    // Byte offset of segment i (i == p: the end of the buffer).
    auto at = [&](int i) { return ring_segment(call.count, p, i).offset * esize; };
    const bool folds = r < extra;
    const int first = folds ? 1 : 0;
    plan->reset(static_cast<std::size_t>(first + 2 * steps + (folds ? 1 : 0)));
    if (folds) {  // op(X_r, X_{r+p}) into U; F is free as the landing area
      Transfer& t = plan->transfers[0];
      set_recv(call, t, 0, r + p, full, bytes, Finalise::kInChunks, kNoGate);
      t.recv_must_land = false;
      plan->actions[0].accumulate_into = user;
    }
    // Halving: this rank reduces segments [lo, lo + width); their partial lies in `base`.
    int lo = 0;
    char* base = user;
    for (int k = 0; k < steps; ++k) {
      const int ti = first + k;
      const int half = p >> (k + 1);
      const int peer = r ^ half;
      const bool lower = (r & half) == 0;
      const int keep = lower ? lo : lo + half;
      const int give = lower ? lo + half : lo;
      const std::size_t keep_b = at(keep), keep_e = at(keep + half);
      const std::size_t give_b = at(give), give_e = at(give + half);
      Transfer& t = plan->transfers[static_cast<std::size_t>(ti)];
      ChunkAction& a = plan->actions[static_cast<std::size_t>(ti)];
      set_send(call, t, 1 + k, peer, base + give_b, give_e - give_b, ti - 1);
      // The previous step's payload was [lo, lo + 2 * half): the lower half is its prefix.
      t.send_gate_whole = give != lo;
      char* other = base == user ? full : user;
      const bool last = k == steps - 1;
      if (lower) {
        set_recv(call, t, 1 + k, peer, landing, keep_e - keep_b, Finalise::kInChunks, kNoGate);
        t.recv_must_land = false;
        a.accumulate_into = base + keep_b;
        if (last && base != user) a.copy_to = user + keep_b;
      } else {
        set_recv(call, t, 1 + k, peer, other + keep_b, keep_e - keep_b, Finalise::kInChunks,
                 kNoGate);
        a.operand = base + keep_b;
        base = other;
        if (last && base != user) {
          // U holds the operand: copy_to overwrites each chunk after it has been read.
          a.copy_to = user + keep_b;
        }
      }
      a.scale = last && call.op == ReduceOp::kMean;
      lo = keep;
    }
    // Doubling: swap the 2^j segments gathered so far with the partner's block.
    const int gather_first = first + steps;
    for (int j = 0; j < steps; ++j) {
      const int ti = gather_first + j;
      const int width = 1 << j;
      const int peer = r ^ width;
      const int mine = r & ~(width - 1);
      const int theirs = peer & ~(width - 1);
      Transfer& t = plan->transfers[static_cast<std::size_t>(ti)];
      set_send(call, t, 1 + steps + j, peer, user + at(mine), at(mine + width) - at(mine),
               ti - 1);
      // Step 0 sends segment r, the last halving step's whole payload; later steps send a block
      // that begins with either of the two received before.
      t.send_gate_whole = j > 0;
      set_recv(call, t, 1 + steps + j, peer, user + at(theirs), at(theirs + width) - at(theirs),
               Finalise::kWhole, j == 0 ? ti - 1 : kNoGate);
    }
    if (folds) {
      const int ti = gather_first + steps;
      Transfer& t = plan->transfers[static_cast<std::size_t>(ti)];
      set_send(call, t, 2 * steps + 1, r + p, user, bytes, ti - 1);
      t.send_gate_whole = true;
    }
  }
};

}  // namespace

const Algorithm& rabenseifner_all_reduce() {
  static const RabenseifnerAllReduce instance;
  return instance;
}

}  // namespace mwms::collective
