// Ring algorithms as transfer plans for TcpRingChannel (one plan builder per collective). They see
// only rank, world size, buffers and the chunk callback; they never touch a socket.
//
// Note [ring segments]: a buffer of `count` elements is cut into world_size segments; segment i
// has count / n elements plus one for i < count % n, so any count (0, prime, not divisible by n)
// works and each rank moves 2(n-1)/n of the buffer in an all-reduce (busbw = algbw * 2(n-1)/n).
#pragma once

#include <cstddef>
#include <vector>

#include "collective/frame.h"
#include "collective/transport/tcp/tcp_ring_channel.h"
#include "mwms/types.h"

namespace mwms::collective {

/// What to do with each received chunk of a transfer (see ReduceSink::on_chunk).
struct ChunkAction {
  char* accumulate_into = nullptr;   // reduce(accumulate_into + b, recv + b): result there
  const char* operand = nullptr;     // reduce(recv + b, operand + b): result in recv
  char* copy_to = nullptr;           // then copy the result here
  bool scale = false;                // then divide the result by world size (ReduceOp::kMean)
};

/// Reusable storage for a plan: grown once to the largest collective, never shrunk.
struct RingPlan {
  std::vector<Transfer> transfers;
  std::vector<ChunkAction> actions;
  void reset(std::size_t n);
};

/// Segment `i` of a `count`-element buffer split n ways: {first element, elements}.
struct Segment {
  std::size_t offset;
  std::size_t count;
};
Segment ring_segment(std::size_t count, int n, int i);

struct CollectiveCall {
  CollectiveKind kind;
  DataType dtype;
  ReduceOp op;
  std::size_t count;  // as the caller passed it
  int root = -1;
  std::uint64_t seq;
  int rank;
  int world_size;
  std::uint8_t algorithm = 0;  // AllReduceAlgorithm, carried in every frame header
};

/// All-reduce algorithms (selector.h chooses one per call).
enum class AllReduceAlgorithm : std::uint8_t { kRing = 0, kGather = 1 };

/// In-place ring all-reduce: n-1 reduce-scatter steps then n-1 all-gather steps. `scratch` holds
/// at least one segment (ceil(count / n) elements).
void plan_all_reduce(const CollectiveCall& call, char* buffer, char* scratch, RingPlan* plan);
/// Latency-optimal all-reduce for small messages: a ring all-gather of every rank's whole buffer
/// into `gather` (n slots of count elements; slot r must already hold this rank's input), n-1
/// transfers instead of 2(n-1). finish_gather_all_reduce() then reduces the slots in rank order,
/// so every rank computes bit-identical results.
void plan_gather_all_reduce(const CollectiveCall& call, char* gather, RingPlan* plan);
void finish_gather_all_reduce(const CollectiveCall& call, const char* gather, char* buffer);

/// Reduce-scatter (rank r ends with block r). `scratch` holds 2 * recv_count elements.
void plan_reduce_scatter(const CollectiveCall& call, const char* send, char* recv, char* scratch,
                         RingPlan* plan);
/// All-gather; the caller has already placed this rank's block at recv + rank * block bytes.
void plan_all_gather(const CollectiveCall& call, char* recv, RingPlan* plan);
/// Pipelined ring broadcast from call.root.
void plan_broadcast(const CollectiveCall& call, char* buffer, RingPlan* plan);

/// Applies RingPlan::actions to received chunks.
class ReduceSink : public ChunkSink {
 public:
  ReduceSink(const RingPlan& plan, DataType dtype, ReduceOp op, int world_size)
      : plan_(plan), dtype_(dtype), op_(op), world_size_(world_size) {}
  void on_chunk(int t, std::size_t begin, std::size_t end) override;

 private:
  const RingPlan& plan_;
  DataType dtype_;
  ReduceOp op_;
  int world_size_;
};

}  // namespace mwms::collective
