// The in-memory transport: ranks are threads of one process and every pair is a RingLink over
// heap memory. It exists so that algorithm plans and the runner get unit tests and threaded
// tests without sockets (tests/unit/collective); the shared-memory transport is the same link
// over a segment shared between processes. It is also a row of the transport table like any
// other (kMemTransportEntry, not selectable by MWMS_TRANSPORT), which shows what adding a
// transport takes (Note [transport table]).
#pragma once

#include <cstdlib>
#include <memory>
#include <vector>

#include "collective/transport/ring_link.h"
#include "collective/transport/transport.h"

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
  struct Free {
    void operator()(char* p) const noexcept { std::free(p); }
  };
  std::unique_ptr<char, Free> flat_;   // kFlatAreaBytes per rank (Note [flat slots])
  std::unique_ptr<char, Free> stage_;  // kFlatStageAreaBytes per rank
};

/// The table's row (transport/registry.cc): ranks that are threads of one process (their "mem"
/// blobs name the same process). Each communicator gets its own MemFabric, named by the
/// fingerprint of the job and rank 0's blob (a fresh nonce per transport), shared by its ranks'
/// links and freed with the last of them. Never automatic; not user-selectable.
extern const TransportEntry kMemTransportEntry;

}  // namespace mwms::collective
