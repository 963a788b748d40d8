#include "collective/plan.h"

#include <algorithm>

namespace mwms::collective {

void Plan::reset(std::size_t n) {
  transfers.assign(n, Transfer{});
  actions.assign(n, ChunkAction{});
}

Segment ring_segment(std::size_t count, int n, int i) {
  std::size_t base = count / static_cast<std::size_t>(n);
  std::size_t rem = count % static_cast<std::size_t>(n);
  std::size_t idx = static_cast<std::size_t>(i);
  return {idx * base + std::min(idx, rem), base + (idx < rem ? 1 : 0)};
}

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

void set_send(const CollectiveCall& call, Transfer& t, int step, int peer, const char* data,
              std::size_t bytes, int gate) {
  t.has_send = true;
  t.send_peer = peer;
  t.send = data;
  t.send_bytes = bytes;
  t.send_gate = gate;
  t.send_header = header_for(call, step, bytes);
}

void set_recv(const CollectiveCall& call, Transfer& t, int step, int peer, char* data,
              std::size_t bytes, bool in_chunks, int gate) {
  t.has_recv = true;
  t.recv_peer = peer;
  t.recv = data;
  t.recv_bytes = bytes;
  t.recv_in_chunks = in_chunks;
  t.recv_gate = gate;
  t.expect_header = header_for(call, step, bytes);
}

}  // namespace mwms::collective
