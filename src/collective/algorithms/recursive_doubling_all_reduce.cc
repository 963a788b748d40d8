// Recursive-doubling all-reduce (Thakur, Rabenseifner & Gropp 2005, section 4.1): log2(p) steps
// for p = the largest power of two <= n; in step k rank r exchanges its whole partial with
// r ^ 2^k and both combine. Every rank sends log2(p) x S bytes (S the message), in log2(p)
// message latencies instead of the ring's 2(n-1): the algorithm for small, latency-bound
// messages. Non-powers of two: the n - p extra ranks r >= p first hand their buffer to r - p,
// which folds it in, and get the result back after the last step (two more latencies).
//
// Note [canonical operand order]: min/max of +0 and -0 (and which NaN payload survives a sum)
// depend on the operand order of kernels::reduce(dst, src) = op(dst, src), so "a op b" on one
// rank and "b op a" on its partner could differ in the last bit. Every combination here is
// therefore op(value of the lower-ranked group, value of the higher-ranked group): the pre-step
// computes op(X_q, X_{q+p}); step k combines the partials of two blocks of 2^k core ranks as
// op(lower block, higher block). Both partners evaluate the same expression on the same bits, so
// by induction every rank of a block of 2^(k+1) holds identical bytes after step k, and the
// extra ranks receive a copy. kMean divides once, chunk by chunk, in the last step, on every core
// rank alike.
//
// Buffers (Note [rd buffers]): a rank must never write the bytes it is still sending. The user's
// buffer U is staged into scratch value buffers B0..B2 first; each step sends one B holding the
// current partial and writes the combined result into another:
//  - the higher partner lands the lower partial in a free B and adds its own (ChunkAction.operand:
//    landing = recv op operand, so recv_must_land);
//  - the lower partner must compute op(own, received): it accumulates the received bytes (landed
//    in the scratch landing area L) into a second copy of its partial, made by the step before
//    (ChunkAction.copy_to) or when staging.
// The receive of step k waits for the send of step k-1 to complete (recv_gate), so at step k only
// the buffer being sent is off limits, and three value buffers always suffice. The last step writes
// its result into U itself; the send of step k+1 is gated prefix-wise on step k (the result of a
// step lies at the same offsets as its payload).
#include <cstring>
#include <string>

#include "collective/algorithms/algorithms.h"
#include "mwms/types.h"

namespace mwms::collective {
namespace {

/// First index of {0, 1, 2} that is neither `a` nor `b`.
int free_buffer(int a, int b) {
  for (int i = 0; i < 3; ++i) {
    if (i != a && i != b) return i;
  }
  return -1;
}

class RecursiveDoublingAllReduce final : public Algorithm {
 public:
  std::string_view name() const noexcept override { return "rd"; }
  AlgorithmId id() const noexcept override { return AlgorithmId::kRecursiveDoubling; }
  CollectiveKind collective() const noexcept override { return CollectiveKind::kAllReduce; }
  // Correct for every count and world size, but each rank sends log2(p) x S bytes and needs
  // 4 x S of scratch, so it refuses messages above kMaxBytes (64 MiB: 256 MiB of scratch), where
  // it is never the right choice; the selector uses it for small messages only.
  static constexpr std::size_t kMaxBytes = std::size_t{64} << 20;
  bool supports(const SelectionInput& in, std::string* why) const override {
    if (!is_all_reduce_kind(in.kind)) {
      if (why != nullptr) *why = "recursive doubling is an all-reduce algorithm";
      return false;
    }
    if (in.bytes > kMaxBytes) {
      if (why != nullptr) {
        *why = std::to_string(in.bytes) + " bytes is above its limit of 64 MiB (it sends " +
               "log2(world size) times the message and needs 4 times its size as scratch; use " +
               "rhd or ring)";
      }
      return false;
    }
    return true;
  }
  std::size_t scratch_bytes(const CollectiveCall& call) const override {
    return 4 * call.count * dtype_size(call.dtype);  // B0, B1, B2 and the landing area L
  }

  // The copies plan() relies on: B0 = this rank's input on a core rank, and B1 = B0 too when it is
  // the lower partner of step 0 without folding an extra rank first.
  void stage(const CollectiveCall& call, Buffers b, char* scratch) const override {
    const int n = call.world_size;
    const int r = call.rank;
    const int p = floor_pow2(n);
    const std::size_t bytes = call.count * dtype_size(call.dtype);
    if (r >= p || bytes == 0) return;
    std::memcpy(scratch, b.recv, bytes);
    const bool folds = r < n - p;
    if (!folds && log2_of(p) > 0 && (r & 1) == 0) std::memcpy(scratch + bytes, b.recv, bytes);
  }

  void plan(const CollectiveCall& call, Buffers b, char* scratch, Plan* plan) const override {
    const int n = call.world_size;
    const int r = call.rank;
    const int p = floor_pow2(n);
    const int steps = log2_of(p);
    const int extra = n - p;
    const std::size_t bytes = call.count * dtype_size(call.dtype);
    char* user = b.recv;
    if (r >= p) {  // an extra rank: hand the buffer over, get the result back
      plan->reset(2);
      set_send(call, plan->transfers[0], 0, r - p, user, bytes, kNoGate);
      set_recv(call, plan->transfers[1], steps + 1, r - p, user, bytes, Finalise::kWhole, 0);
      return;
    }
    char* bufs[3] = {scratch, scratch + bytes, scratch + 2 * bytes};
    char* landing = scratch + 3 * bytes;
    const bool folds = r < extra;  // receives the buffer of extra rank r + p first
    const int first = folds ? 1 : 0;  // transfer index of RD step 0
    plan->reset(static_cast<std::size_t>(first + steps + (folds ? 1 : 0)));
    auto low_at = [&](int k) { return k < steps && (r & (1 << k)) == 0; };
    int send_i = 0;   // value buffer holding the partial that the next step sends
    int copy_i = -1;  // a second copy of it, for a step where this rank is the lower partner
    if (folds) {
      // op(X_r, X_{r+p}): accumulate the extra rank's buffer into the staged copy of ours.
      Transfer& t = plan->transfers[0];
      set_recv(call, t, 0, r + p, landing, bytes, Finalise::kInChunks, kNoGate);
      t.recv_must_land = false;
      ChunkAction& a = plan->actions[0];
      a.accumulate_into = bufs[0];
      if (low_at(0)) {
        copy_i = 1;
        a.copy_to = bufs[copy_i];
      }
    } else if (low_at(0)) {
      copy_i = 1;  // staged by stage()
    }
    for (int k = 0; k < steps; ++k) {
      const int ti = first + k;
      const int peer = r ^ (1 << k);
      const bool last = k == steps - 1;
      Transfer& t = plan->transfers[static_cast<std::size_t>(ti)];
      ChunkAction& a = plan->actions[static_cast<std::size_t>(ti)];
      set_send(call, t, k + 1, peer, bufs[send_i], bytes, ti - 1);
      int result_i;
      if (low_at(k)) {
        // op(own, received): the received bytes are only read, through the action.
        set_recv(call, t, k + 1, peer, landing, bytes, Finalise::kInChunks, ti - 1);
        t.recv_must_land = false;
        a.accumulate_into = bufs[copy_i];
        result_i = copy_i;
        if (last) a.copy_to = user;
      } else {
        // op(received, own): land the lower partial in a free buffer (U in the last step).
        result_i = free_buffer(send_i, -1);
        set_recv(call, t, k + 1, peer, last ? user : bufs[result_i], bytes, Finalise::kInChunks,
                 ti - 1);
        a.operand = bufs[send_i];
      }
      a.scale = last && call.op == ReduceOp::kMean;
      copy_i = -1;
      if (low_at(k + 1)) {
        copy_i = free_buffer(send_i, result_i);
        a.copy_to = bufs[copy_i];
      }
      send_i = result_i;
    }
    if (folds) {  // the result back to the extra rank, from U as the last step finalises it
      const int ti = first + steps;
      set_send(call, plan->transfers[static_cast<std::size_t>(ti)], steps + 1, r + p, user, bytes,
               ti - 1);
    }
  }
};

}  // namespace

const Algorithm& recursive_doubling_all_reduce() {
  static const RecursiveDoublingAllReduce instance;
  return instance;
}

}  // namespace mwms::collective
