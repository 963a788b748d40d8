#include "collective/plan.h"

#include <algorithm>
#include <map>

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
              std::size_t bytes, Finalise how, int gate) {
  t.has_recv = true;
  t.recv_peer = peer;
  t.recv = data;
  t.recv_bytes = bytes;
  t.recv_in_chunks = how == Finalise::kInChunks;
  t.recv_gate = gate;
  t.expect_header = header_for(call, step, bytes);
}

}  // namespace mwms::collective

namespace mwms::collective {

HostLayout HostLayout::from_hosts(const std::vector<int>& host_of) {
  HostLayout l;
  const int n = static_cast<int>(host_of.size());
  std::map<int, int> renumber;  // given host number -> index by lowest rank
  std::vector<int> size;
  l.host_of.resize(host_of.size());
  l.local_index.resize(host_of.size());
  for (int r = 0; r < n; ++r) {
    auto [it, fresh] = renumber.emplace(host_of[static_cast<std::size_t>(r)],
                                        static_cast<int>(renumber.size()));
    if (fresh) size.push_back(0);
    l.host_of[static_cast<std::size_t>(r)] = it->second;
    l.local_index[static_cast<std::size_t>(r)] = size[static_cast<std::size_t>(it->second)]++;
  }
  l.num_hosts = std::max(1, static_cast<int>(size.size()));
  const bool uniform =
      !size.empty() && std::all_of(size.begin(), size.end(), [&](int k) { return k == size[0]; });
  if (uniform) {
    l.ranks_per_host = size[0];
    l.members.resize(host_of.size());
    for (int r = 0; r < n; ++r) {
      const std::size_t h = static_cast<std::size_t>(l.host_of[static_cast<std::size_t>(r)]);
      l.members[h * static_cast<std::size_t>(l.ranks_per_host) +
                static_cast<std::size_t>(l.local_index[static_cast<std::size_t>(r)])] = r;
    }
  }
  return l;
}

}  // namespace mwms::collective
