#include "collective/transport/mem/mem_transport.h"

#include <cstdlib>

#include "common/logging.h"

namespace mwms::collective {

struct MemFabric::Pair {
  ByteRingControl control;
  char* data = nullptr;
  ~Pair() { std::free(data); }
};

MemFabric::MemFabric(int world_size, std::size_t ring_bytes)
    : world_size_(world_size), ring_bytes_(ring_bytes), bells_(new Doorbell[world_size]) {
  MWMS_CHECK(ring_bytes % 64 == 0 && ring_bytes >= 128, "ring size must be a multiple of 64");
  pairs_.resize(static_cast<std::size_t>(world_size) * static_cast<std::size_t>(world_size));
  for (auto& p : pairs_) {
    p = std::make_unique<Pair>();
    p->data = static_cast<char*>(std::aligned_alloc(64, ring_bytes));
  }
}

MemFabric::~MemFabric() = default;

std::vector<std::unique_ptr<Link>> MemFabric::links_of(int rank) {
  std::vector<std::unique_ptr<Link>> links(static_cast<std::size_t>(world_size_));
  TransportCaps caps;
  caps.name = "mem";
  for (int peer = 0; peer < world_size_; ++peer) {
    if (peer == rank) continue;
    Pair& out = *pairs_[static_cast<std::size_t>(rank * world_size_ + peer)];
    Pair& in = *pairs_[static_cast<std::size_t>(peer * world_size_ + rank)];
    links[static_cast<std::size_t>(peer)] = std::make_unique<RingLink>(
        peer, caps, ByteRing{&out.control, out.data, ring_bytes_},
        ByteRing{&in.control, in.data, ring_bytes_}, &bells_[rank], &bells_[peer]);
  }
  return links;
}

}  // namespace mwms::collective
