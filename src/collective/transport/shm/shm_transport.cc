#include "collective/transport/shm/shm_transport.h"

#include "collective/transport/shm/shm_link.h"
#include "common/env.h"
#include "common/logging.h"
#include "mwms/errors.h"

namespace mwms::collective {

namespace {

constexpr std::size_t kPage = 4096;

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
  try {
    segment_->reserve(peers);
  } catch (const BackendError& e) {
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
      theirs->reserve({ctx.rank});
    } catch (const BootstrapError& e) {
      throw BootstrapError(who + e.message(), ec);
    } catch (const BackendError& e) {
      throw BackendError(who + e.message(), e.native_code(), ec);
    }
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
  if (ring < options.chunk_bytes) {
    throw InvalidArgument("MWMS_SHM_RING_BYTES=" + std::to_string(asked) +
                          " is smaller than one chunk (" + std::to_string(options.chunk_bytes) +
                          " bytes, MWMS_CHUNK_BYTES); use at least that, or 0 for 4 chunks");
  }
  return std::make_unique<ShmTransport>(options, ring);
}

namespace {

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

void shm_descriptors(common::DescriptorBudget& budget) { ++budget.shm_peers; }

// Over shared memory a latency is a few microseconds and bytes are cheap to copy: recursive
// doubling's whole-buffer exchanges stop paying off above 8 KiB, and the ring's pipeline beats
// Rabenseifner from a few hundred KiB (n = 4, 2 cores; docs/algorithms.md).
constexpr LinkTuning kShmTuning{8192, 256 << 10, 0, true};

}  // namespace

const TransportEntry kShmTransportEntry{"shm", 30, true, true, make_shm_transport,
                                        shm_cannot_connect, shm_descriptors, kShmTuning};

}  // namespace mwms::collective
