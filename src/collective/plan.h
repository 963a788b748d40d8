// A collective as a transfer plan (DESIGN "The transport seam"): what each step sends to which
// peer, what it receives from which peer, how received bytes are finalised (reduced, copied,
// scaled) and which step's bytes a send must wait for. Algorithms (algorithms/) build plans;
// the PlanRunner (engine/) executes them over per-peer links. Plans know ranks, buffers and
// element types, never sockets, segments or MPI calls.
//
// Note [ring gating]: the send of transfer t may depend on what transfer g = send_gate received:
// only bytes that the runner has finalised (reduced or copied) in g may be sent. This is what
// lets step s+1 start sending while step s is still receiving (receive, reduce and send overlap).
// A recv_gate g says the receive buffer of t is still being sent by transfer g (double-buffered
// scratch), so t's payload must not land before g's send completed.
//
// Note [plan order]: the runner keeps one send cursor and one receive cursor and moves each
// through the transfers in index order, so sends leave and receives land in plan order; the
// sends of a rank to one peer arrive in that order at the peer, whose plan must list the
// matching receives in the same order (every link is FIFO per direction).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "collective/frame.h"
#include "mwms/types.h"

namespace mwms::collective {

/// What to do with each received chunk of a transfer (applied by the runner, in chunk order).
/// Payload bytes [b, e) of the transfer are seen at `src + b` (the link's landing area or, on a
/// link with in-place receives, the peer's bytes where they lie):
///   1. accumulate_into set: reduce(accumulate_into + b, src + b); result there;
///      otherwise the result is the received bytes themselves;
///   2. operand set: reduce(result, operand + b) (result must be writable: not in place);
///   3. scale: divide the result by the world size (ReduceOp::kMean);
///   4. copy_to set: copy the result to copy_to + b (unless it is already there).
struct ChunkAction {
  char* accumulate_into = nullptr;
  const char* operand = nullptr;
  char* copy_to = nullptr;
  bool scale = false;
};

/// One step of a plan: at most one send and one receive, each with its own peer.
struct Transfer {
  bool has_send = false;
  int send_peer = -1;
  const char* send = nullptr;
  std::size_t send_bytes = 0;
  int send_gate = -1;  // Note [ring gating]
  bool send_gate_whole = false;  // wait for all of the gate's bytes, not a matching prefix
  FrameHeader send_header;

  bool has_recv = false;
  int recv_peer = -1;
  char* recv = nullptr;         // landing area (recv_bytes); may be bypassed, see recv_must_land
  std::size_t recv_bytes = 0;
  int recv_gate = -1;           // Note [ring gating]
  bool recv_in_chunks = false;  // finalise in chunk_bytes pieces through the action
  // True when the payload must end at `recv` (nothing else reads it there: an all-gather or
  // broadcast step). False when only the action consumes it (reduce into accumulate_into), so a
  // link with in-place receives may let the action read the peer's bytes where they lie.
  bool recv_must_land = true;
  FrameHeader expect_header;
};

/// Which ranks share a host (from the peer-info exchange: same host id), identical on every rank.
/// Hosts are numbered in the order of their lowest rank. Built once per communicator.
struct HostLayout {
  int num_hosts = 1;
  int ranks_per_host = 0;       // when every host has the same number of ranks, else 0
  std::vector<int> host_of;     // host of every rank
  std::vector<int> local_index; // position of every rank among its host's ranks (ascending)
  std::vector<int> members;     // uniform only: the ranks of host h at [h * L, (h + 1) * L)

  /// The layout of `host_of` (host numbers in any order; renumbered by lowest rank).
  static HostLayout from_hosts(const std::vector<int>& host_of);
  /// Rank at position `local` of host `host` (uniform layouts only).
  int member(int host, int local) const {
    return members[static_cast<std::size_t>(host * ranks_per_host + local)];
  }
};

/// The call every plan is built for: the collective's identity (carried in every envelope), this
/// rank and the world.
struct CollectiveCall {
  CollectiveKind kind;
  DataType dtype;
  ReduceOp op;
  std::size_t count;  // as the caller passed it
  int root = -1;
  std::uint64_t seq;
  int rank;
  int world_size;
  std::uint8_t algorithm = 0;  // AlgorithmId, carried in every frame header
  const HostLayout* hosts = nullptr;  // the communicator's (hierarchical algorithms need it)
};

/// Reusable storage for a plan: grown once to the largest collective, never shrunk, so building
/// a plan in steady state allocates nothing.
struct Plan {
  std::vector<Transfer> transfers;
  std::vector<ChunkAction> actions;
  void reset(std::size_t n);
};

/// Segment `i` of a `count`-element buffer split n ways: {first element, elements}.
/// Note [ring segments]: segment i has count / n elements plus one for i < count % n, so any count
/// (0, prime, not divisible by n) works.
struct Segment {
  std::size_t offset;
  std::size_t count;
};
Segment ring_segment(std::size_t count, int n, int i);

/// ((i % n) + n) % n: ring positions for negative offsets.
inline int wrap_rank(int i, int n) { return ((i % n) + n) % n; }

/// Largest power of two <= n (n >= 1): the core ranks of recursive doubling and halving.
inline int floor_pow2(int n) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

/// Smallest k with 2^k >= p (log2 of a power of two).
inline int log2_of(int p) {
  int k = 0;
  while ((1 << k) < p) ++k;
  return k;
}

/// Header of step `step` of `call` with `payload` bytes.
FrameHeader header_for(const CollectiveCall& call, int step, std::size_t payload);
/// A transfer whose send or receive waits for no other (Note [ring gating]).
constexpr int kNoGate = -1;

/// How the runner finalises a receive (Transfer::recv_in_chunks): in chunk_bytes pieces through
/// the action, so that a gated send can forward each piece as soon as it is final (reductions
/// of a pipeline), or as one piece once all of it arrived.
enum class Finalise : bool { kWhole = false, kInChunks = true };

/// Fills the send half of `t` (to `peer`): `bytes` of `data` as step `step`, gated by transfer
/// `gate` or kNoGate.
void set_send(const CollectiveCall& call, Transfer& t, int step, int peer, const char* data,
              std::size_t bytes, int gate);
/// Fills the receive half of `t` (from `peer`): `bytes` landing at `data` as step `step`,
/// finalised as `how` says, gated by transfer `gate` or kNoGate.
void set_recv(const CollectiveCall& call, Transfer& t, int step, int peer, char* data,
              std::size_t bytes, Finalise how, int gate);

}  // namespace mwms::collective
