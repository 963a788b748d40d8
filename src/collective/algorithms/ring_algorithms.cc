#include "collective/algorithms/ring_algorithms.h"

#include <cstring>

#include "kernels/reduce.h"

namespace mwms::collective {

namespace {

int wrap(int i, int n) { return ((i % n) + n) % n; }

FrameHeader header_for(const CollectiveCall& call, int step, std::size_t payload) {
  FrameHeader h;
  h.kind = static_cast<std::uint8_t>(call.kind);
  h.dtype = static_cast<std::uint8_t>(call.dtype);
  h.op = static_cast<std::uint8_t>(call.op);
  h.root = call.root;
  h.algorithm = call.algorithm;
  h.seq = call.seq;
  h.count = call.count;
  h.step = step;
  h.payload_bytes = payload;
  return h;
}

void set_send(const CollectiveCall& call, Transfer& t, int step, const char* data,
              std::size_t bytes, int gate) {
  t.has_send = true;
  t.send = data;
  t.send_bytes = bytes;
  t.send_gate = gate;
  t.send_header = header_for(call, step, bytes);
}

void set_recv(const CollectiveCall& call, Transfer& t, int step, char* data, std::size_t bytes,
              bool in_chunks, int gate) {
  t.has_recv = true;
  t.recv = data;
  t.recv_bytes = bytes;
  t.recv_in_chunks = in_chunks;
  t.recv_gate = gate;
  t.expect_header = header_for(call, step, bytes);
}

}  // namespace

void RingPlan::reset(std::size_t n) {
  transfers.assign(n, Transfer{});
  actions.assign(n, ChunkAction{});
}

Segment ring_segment(std::size_t count, int n, int i) {
  std::size_t base = count / static_cast<std::size_t>(n);
  std::size_t rem = count % static_cast<std::size_t>(n);
  std::size_t idx = static_cast<std::size_t>(i);
  return {idx * base + std::min(idx, rem), base + (idx < rem ? 1 : 0)};
}

void plan_all_reduce(const CollectiveCall& call, char* buffer, char* scratch, RingPlan* plan) {
  const int n = call.world_size;
  const int r = call.rank;
  const std::size_t esize = dtype_size(call.dtype);
  plan->reset(static_cast<std::size_t>(2 * (n - 1)));
  // Reduce-scatter: step s sends segment r-s, receives segment r-s-1 and reduces it into place.
  for (int s = 0; s < n - 1; ++s) {
    Segment out = ring_segment(call.count, n, wrap(r - s, n));
    Segment in = ring_segment(call.count, n, wrap(r - s - 1, n));
    Transfer& t = plan->transfers[s];
    set_send(call, t, s, buffer + out.offset * esize, out.count * esize, s - 1);
    set_recv(call, t, s, scratch, in.count * esize, true, -1);
    ChunkAction& a = plan->actions[s];
    a.accumulate_into = buffer + in.offset * esize;
    a.scale = call.op == ReduceOp::kMean && s == n - 2;  // segment r+1 is complete here
  }
  // All-gather: step s sends segment r-s+1, receives segment r-s straight into place.
  for (int s = 0; s < n - 1; ++s) {
    int t_index = n - 1 + s;
    Segment out = ring_segment(call.count, n, wrap(r - s + 1, n));
    Segment in = ring_segment(call.count, n, wrap(r - s, n));
    Transfer& t = plan->transfers[t_index];
    set_send(call, t, t_index, buffer + out.offset * esize, out.count * esize, t_index - 1);
    set_recv(call, t, t_index, buffer + in.offset * esize, in.count * esize, false, -1);
  }
}

void plan_gather_all_reduce(const CollectiveCall& call, char* gather, RingPlan* plan) {
  const int n = call.world_size;
  const int r = call.rank;
  const std::size_t bytes = call.count * dtype_size(call.dtype);
  plan->reset(static_cast<std::size_t>(n - 1));
  // Step s forwards the buffer of rank r-s (step 0: our own) and receives that of rank r-s-1.
  for (int s = 0; s < n - 1; ++s) {
    Transfer& t = plan->transfers[s];
    set_send(call, t, s, gather + wrap(r - s, n) * bytes, bytes, s - 1);
    set_recv(call, t, s, gather + wrap(r - s - 1, n) * bytes, bytes, false, -1);
  }
}

void finish_gather_all_reduce(const CollectiveCall& call, const char* gather, char* buffer) {
  const std::size_t bytes = call.count * dtype_size(call.dtype);
  if (bytes == 0) return;
  // Rank order, not arrival order: float results must not depend on who computes them.
  std::memcpy(buffer, gather, bytes);
  for (int k = 1; k < call.world_size; ++k) {
    kernels::reduce(buffer, gather + k * bytes, call.count, call.dtype, call.op);
  }
  if (call.op == ReduceOp::kMean) {
    kernels::scale_divide(buffer, call.count, call.dtype, call.world_size);
  }
}

void plan_reduce_scatter(const CollectiveCall& call, const char* send, char* recv, char* scratch,
                         RingPlan* plan) {
  const int n = call.world_size;
  const int r = call.rank;
  const std::size_t block = (call.count / static_cast<std::size_t>(n)) * dtype_size(call.dtype);
  char* bufs[2] = {scratch, scratch + block};
  plan->reset(static_cast<std::size_t>(n - 1));
  // Step s sends the partial of block r-s-1 (step 0: our own input), receives the partial of
  // block r-s-2 into alternating scratch and adds our input; the last step yields block r.
  for (int s = 0; s < n - 1; ++s) {
    int out_block = wrap(r - s - 1, n);
    int in_block = wrap(r - s - 2, n);
    Transfer& t = plan->transfers[s];
    const char* src = s == 0 ? send + out_block * block : bufs[(s - 1) % 2];
    set_send(call, t, s, src, block, s - 1);
    set_recv(call, t, s, bufs[s % 2], block, true, s >= 2 ? s - 1 : -1);
    ChunkAction& a = plan->actions[s];
    a.operand = send + in_block * block;
    if (s == n - 2) {
      a.copy_to = recv;
      a.scale = call.op == ReduceOp::kMean;
    }
  }
}

void plan_all_gather(const CollectiveCall& call, char* recv, RingPlan* plan) {
  const int n = call.world_size;
  const int r = call.rank;
  const std::size_t block = (call.count / static_cast<std::size_t>(n)) * dtype_size(call.dtype);
  plan->reset(static_cast<std::size_t>(n - 1));
  for (int s = 0; s < n - 1; ++s) {
    Transfer& t = plan->transfers[s];
    set_send(call, t, s, recv + wrap(r - s, n) * block, block, s - 1);
    set_recv(call, t, s, recv + wrap(r - s - 1, n) * block, block, false, -1);
  }
}

void plan_broadcast(const CollectiveCall& call, char* buffer, RingPlan* plan) {
  const int n = call.world_size;
  const int position = wrap(call.rank - call.root, n);
  const std::size_t bytes = call.count * dtype_size(call.dtype);
  plan->reset(1);
  Transfer& t = plan->transfers[0];
  bool receives = position != 0;
  if (receives) set_recv(call, t, 0, buffer, bytes, false, -1);
  // Forward what has arrived while the rest is still coming (gated on our own receive).
  if (position != n - 1) set_send(call, t, 0, buffer, bytes, receives ? 0 : -1);
}

void ReduceSink::on_chunk(int t, std::size_t begin, std::size_t end) {
  const ChunkAction& a = plan_.actions[static_cast<std::size_t>(t)];
  char* recv = plan_.transfers[static_cast<std::size_t>(t)].recv;
  const std::size_t esize = dtype_size(dtype_);
  const std::size_t elems = (end - begin) / esize;
  char* result = recv + begin;
  if (a.accumulate_into != nullptr) {
    result = a.accumulate_into + begin;
    kernels::reduce(result, recv + begin, elems, dtype_, op_);
  }
  if (a.operand != nullptr) kernels::reduce(result, a.operand + begin, elems, dtype_, op_);
  if (a.scale) kernels::scale_divide(result, elems, dtype_, world_size_);
  if (a.copy_to != nullptr && a.copy_to + begin != result) {
    std::memmove(a.copy_to + begin, result, end - begin);
  }
}

}  // namespace mwms::collective
