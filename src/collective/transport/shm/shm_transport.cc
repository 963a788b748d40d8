#include "collective/transport/shm/shm_transport.h"

#include "collective/transport/shm/shm_link.h"
#include "common/env.h"
#include "common/logging.h"
#include "mwms/errors.h"

namespace mwms::collective {

namespace {

constexpr std::size_t kPage = 4096;  // rings are whole pages (ShmSegment::create requires it)

TransportCaps shm_caps(std::size_t chunk_bytes) {
  TransportCaps c;
  c.name = "shm";
  c.chunk_bytes = chunk_bytes;
  return c;
}

}  // namespace

ShmTransport::ShmTransport(const TransportOptions& options, std::size_t ring_bytes)
    : options_(options),
      caps_(shm_caps(options.chunk_bytes)),
      segment_(ShmSegment::create(options.rank, options.world_size, ring_bytes,
                                  options.job_fingerprint)) {
  MWMS_LOG_DEBUG(kRing, "shm segment " << segment_->address() << ": " << options.world_size
                                       << " inbound rings of " << ring_bytes << " bytes");
}

std::vector<std::unique_ptr<Link>> ShmTransport::connect(const std::vector<int>& peers,
                                                         const ConnectContext& ctx) {
  const int n = options_.world_size;
  MWMS_CHECK(ctx.rank == options_.rank && ctx.world_size == n && ctx.peers != nullptr &&
                 static_cast<int>(ctx.peers->size()) == n,
             "shm connect for another communicator");
  ErrorContext ec;
  ec.rank = ctx.rank;
  ec.world_size = n;
  ec.op = "link setup";
  ec.transport = "shm";
  for (int p : peers) MWMS_CHECK(p >= 0 && p < n && p != ctx.rank, "bad shm peer");
  // All our inbound rings at once: reserve()'s memory check then sees this rank's whole share,
  // and a shortage fails before any peer's segment is mapped.
  try {
    segment_->reserve(peers);
  } catch (const BackendError& e) {  // rethrown with this rank and the phase in its context
    throw BackendError(e.message(), e.native_code(), ec);
  }
  std::vector<std::unique_ptr<Link>> links;
  links.reserve(peers.size());
  for (int p : peers) {
    const bootstrap::PeerInfo& info = (*ctx.peers)[static_cast<std::size_t>(p)];
    ec.peer_rank = p;
    ec.peer_address = info.address;
    const std::string who = "rank " + std::to_string(ctx.rank) +
                            " cannot use shared memory with rank " + std::to_string(p) + " (" +
                            info.address + "): ";
    // Defensive: choose_transports() gives shm only to pairs where both published a segment
    // (shm_cannot_connect), so only a caller that bypassed it gets here.
    auto it = info.blobs.find("shm");
    if (it == info.blobs.end()) {
      throw BootstrapError(who +
                               "it published no shared-memory address (MWMS_SHM_DISABLE=1 "
                               "there?)",
                           ec);
    }
    std::shared_ptr<ShmSegment> theirs;
    try {
      theirs = ShmSegment::open(it->second, p, n, options_.job_fingerprint);
      // The ring we write lives in their segment: allocate it from here too, since whichever end
      // connects first must find it backed (Note [shm segment]).
      theirs->reserve({ctx.rank});
    } catch (const BootstrapError& e) {
      throw BootstrapError(who + e.message(), ec);
    } catch (const BackendError& e) {
      throw BackendError(who + e.message(), e.native_code(), ec);
    }
    // The link shares both segments: the mappings outlive this transport (shm_link.h).
    links.push_back(std::make_unique<ShmLink>(ctx.rank, p, caps_, segment_, std::move(theirs)));
  }
  MWMS_LOG_DEBUG(kRing, "shm links to " << peers.size() << " peers");
  return links;
}

std::unique_ptr<Transport> make_shm_transport(const TransportOptions& options) {
  if (common::env_string("MWMS_SHM_DISABLE") == "1" || !options.may_share_host) return nullptr;
  const long long asked = common::env_int("MWMS_SHM_RING_BYTES");
  if (asked < 0) throw InvalidArgument("MWMS_SHM_RING_BYTES must be >= 0");
  std::size_t ring = asked == 0 ? 4 * options.chunk_bytes : static_cast<std::size_t>(asked);
  ring = (ring + kPage - 1) / kPage * kPage;
  // Below one chunk the runner could never reduce a whole chunk where it lies and would fall
  // back to partial reductions; 4 chunks (the default) let the sender run ahead of the reducer.
  if (ring < options.chunk_bytes) {
    throw InvalidArgument("MWMS_SHM_RING_BYTES=" + std::to_string(asked) +
                          " is smaller than one chunk (" + std::to_string(options.chunk_bytes) +
                          " bytes, MWMS_CHUNK_BYTES); use at least that, or 0 for 4 chunks");
  }
  return std::make_unique<ShmTransport>(options, ring);
}

namespace {

// Both ends evaluate it on the same published data and must reach the same answer (Note
// [transport table]); host_id (host name, boot id, network namespace) is what makes a /proc path
// of the peer's pid meaningful here.
std::string shm_cannot_connect(const bootstrap::PeerInfo& me, const bootstrap::PeerInfo& peer) {
  if (peer.host_id != me.host_id) {
    return "rank " + std::to_string(peer.rank) + " (" + peer.address +
           ") is on another host than rank " + std::to_string(me.rank);
  }
  for (const bootstrap::PeerInfo* p : {&me, &peer}) {
    if (p->blobs.count("shm") == 0) {
      return "rank " + std::to_string(p->rank) + " has shared memory disabled "
             "(MWMS_SHM_DISABLE=1) or unavailable";
    }
  }
  return "";
}

// Opening a peer's segment holds one memfd descriptor per shm peer for the link's lifetime.
void shm_descriptors(common::DescriptorBudget& budget) { ++budget.shm_peers; }

// Over shared memory a latency is a few microseconds and bytes are cheap to copy: recursive
// doubling's whole-buffer exchanges stop paying off above 8 KiB, and the ring's pipeline beats
// Rabenseifner from a few hundred KiB (n = 4, 2 cores; docs/algorithms.md). Every shm link
// offers the flat slots (Note [flat slots]), which beat recursive doubling up to
// kShmFlatMaxBytes (Note [flat all-reduce] in algorithms/flat_all_reduce.cc).
// With more ranks than cores, where each of the ring's or Rabenseifner's hand-offs may wait for
// the scheduler, its two hand-offs win up to its 1 MiB sets (n = 4 on 2 cores, 8 KiB - 1 MiB:
// 1.1-1.6x the selector's choice before; Note [flat staging] in engine/flat_runner.cc).
constexpr std::size_t kShmFlatMaxBytes = 2048;
constexpr LinkTuning kShmTuning{8192, 256 << 10, 0, true, true, kShmFlatMaxBytes, kFlatStageBytes};

}  // namespace

// Priority 30, above TCP's 10: under auto a pair on one host takes shared memory (~0.3 us one
// way against loopback TCP's ~6-15 us, docs/architecture.md).
const TransportEntry kShmTransportEntry{"shm", 30, true, true, make_shm_transport,
                                        shm_cannot_connect, shm_descriptors, kShmTuning};

}  // namespace mwms::collective
