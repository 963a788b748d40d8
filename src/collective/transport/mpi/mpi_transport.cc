#include "collective/transport/mpi/mpi_transport.h"

#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <set>

#include "collective/transport/mpi/mpi_link.h"
#include "common/logging.h"
#include "mwms/errors.h"

namespace mwms::collective {

namespace {

// Largest payload piece: far below INT_MAX (MPI counts are int) and a multiple of 64.
constexpr std::size_t kMaxPieceBytes = std::size_t{1} << 30;

// Note [mpi piece size]: each MPI message above Open MPI's eager limit pays a rendezvous (request
// to send, the receiver's single copy inside MPI_Test, a fin back), tens of microseconds here
// with CMA, where our shm ring pays nothing per chunk. So unless MWMS_CHUNK_BYTES (or
// CommunicatorOptions::chunk_bytes) is set, MPI links cut payloads into pieces of at least
// 8 MiB while the plan keeps its 256 KiB reduce granularity: on the 2-core bench host
// (bench/all_reduce_perf --backend mpi --compare mpi, n = 2, 16-64 MiB) 256 KiB pieces ran at
// 0.5-0.7x MPI_Allreduce and 4 MiB pieces at 0.9-1.1x; with interleaved timing (3 runs each)
// 4 MiB pieces gave 0.86-0.89x at 256 MiB and 8 MiB pieces 0.97-1.26x, the same at 4-64 MiB
// (0.95-1.4x). A sender then posts a piece once the plan made all of it final, so a ring's
// forwarding overlaps in pieces, not chunks.
constexpr std::size_t kDefaultPieceBytes = std::size_t{8} << 20;

ErrorContext setup_context(const ConnectContext& ctx, int peer) {
  ErrorContext c;
  c.rank = ctx.rank;
  c.world_size = ctx.world_size;
  c.op = "link setup";
  c.transport = "mpi";
  c.peer_rank = peer;
  return c;
}

// Parses "<mpi rank>:<chunk bytes>"; false when malformed.
bool parse_blob(const std::string& blob, long* mpi_rank, long long* chunk) {
  const std::size_t colon = blob.find(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 >= blob.size()) return false;
  char* end = nullptr;
  *mpi_rank = std::strtol(blob.c_str(), &end, 10);
  if (end != blob.c_str() + colon) return false;
  *chunk = std::strtoll(blob.c_str() + colon + 1, &end, 10);
  return *end == '\0';
}

}  // namespace

std::unique_ptr<Transport> make_mpi_transport(const TransportOptions& options) {
  if (!bootstrap::launched_by_mpi()) return nullptr;
  bootstrap::MpiRuntime& runtime = bootstrap::MpiRuntime::acquire();
  if (runtime.world_size() != options.world_size) {
    // MPI_Comm_dup is collective over MPI_COMM_WORLD: processes outside this cluster would never
    // join it.
    MWMS_LOG_WARN(kNet, "no MPI transport: the MPI world has " << runtime.world_size()
                            << " processes but the cluster has " << options.world_size);
    return nullptr;
  }
  return std::make_unique<MpiTransport>(runtime, options);
}

MpiTransport::MpiTransport(bootstrap::MpiRuntime& runtime, const TransportOptions& options)
    : runtime_(runtime), rank_(options.rank), world_size_(options.world_size),
      chunk_bytes_(std::min(std::max<std::size_t>(options.mpi_piece_bytes > 0
                                                       ? options.mpi_piece_bytes
                                                       : std::max(options.chunk_bytes,
                                                                  kDefaultPieceBytes),
                                                   64),
                            kMaxPieceBytes)),
      caps_(mpi_caps(chunk_bytes_)) {}

std::string MpiTransport::local_address() const {
  return std::to_string(runtime_.world_rank()) + ":" + std::to_string(chunk_bytes_);
}

std::vector<std::unique_ptr<Link>> MpiTransport::connect(const std::vector<int>& peers,
                                                         const ConnectContext& ctx) {
  MWMS_CHECK(ctx.peers != nullptr, "MPI connect without peer info");
  // Map every peer through its blob first: nothing collective happens before all are valid.
  std::vector<int> mpi_ranks;
  std::set<long> seen{runtime_.world_rank()};
  for (int p : peers) {
    const bootstrap::PeerInfo& info = (*ctx.peers)[static_cast<std::size_t>(p)];
    auto it = info.blobs.find("mpi");
    long mpi_rank = -1;
    long long chunk = 0;
    if (it == info.blobs.end() || !parse_blob(it->second, &mpi_rank, &chunk) || mpi_rank < 0 ||
        mpi_rank >= runtime_.world_size() || !seen.insert(mpi_rank).second) {
      throw BootstrapError("rank " + std::to_string(p) + " published no valid MPI address (" +
                               (it == info.blobs.end() ? std::string("none") : it->second) +
                               "); every rank must run under the same mpirun",
                           setup_context(ctx, p));
    }
    if (static_cast<std::size_t>(chunk) != chunk_bytes_) {
      throw BootstrapError("rank " + std::to_string(p) + " cuts MPI payloads into pieces of " +
                               std::to_string(chunk) + " bytes but rank " +
                               std::to_string(rank_) + " into " + std::to_string(chunk_bytes_) +
                               "; MWMS_CHUNK_BYTES must be the same on every rank",
                           setup_context(ctx, p));
    }
    mpi_ranks.push_back(static_cast<int>(mpi_rank));
  }
  MPI_Comm comm = MPI_COMM_NULL;
  {
    std::unique_lock<std::mutex> lock = runtime_.serialise();
    bootstrap::throw_if_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &comm), "MPI_Comm_dup",
                            setup_context(ctx, -1));
    int rc = MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    if (rc != MPI_SUCCESS) MPI_Comm_free(&comm);
    bootstrap::throw_if_mpi(rc, "MPI_Comm_set_errhandler", setup_context(ctx, -1));
  }
  auto shared = std::make_shared<MpiComm>(runtime_, comm);
  std::vector<std::unique_ptr<Link>> links;
  for (std::size_t i = 0; i < peers.size(); ++i) {
    links.push_back(std::make_unique<MpiLink>(peers[i], mpi_ranks[i], shared, chunk_bytes_));
  }
  MWMS_LOG_DEBUG(kNet, "mpi links to " << peers.size() << " peers (mpi world rank "
                                       << runtime_.world_rank() << ", pieces of " << chunk_bytes_
                                       << " bytes)");
  return links;
}

}  // namespace mwms::collective
