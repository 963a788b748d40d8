// The in-memory transport: ranks are threads of one process and every pair is a RingLink over
// heap memory. It exists so that algorithm plans and the runner get unit tests and threaded
// tests without sockets (tests/unit/collective); the shared-memory transport is the same link
// over a segment shared between processes.
#pragma once

#include <memory>
#include <vector>

#include "collective/transport/ring_link.h"

namespace mwms::collective {

class MemFabric {
 public:
  /// Rings of `ring_bytes` (a multiple of 64, at least 128) for every ordered pair of
  /// `world_size` ranks.
  MemFabric(int world_size, std::size_t ring_bytes);
  ~MemFabric();
  MemFabric(const MemFabric&) = delete;
  MemFabric& operator=(const MemFabric&) = delete;

  /// Links of `rank`, by peer rank (nullptr at `rank`). Call once per rank.
  std::vector<std::unique_ptr<Link>> links_of(int rank);

 private:
  struct Pair;
  int world_size_;
  std::size_t ring_bytes_;
  std::vector<std::unique_ptr<Pair>> pairs_;  // [from * n + to]
  std::unique_ptr<Doorbell[]> bells_;
};

}  // namespace mwms::collective
