// Which transport each pair uses, and the names of the transports. This is the one file of the
// transport layer that knows every transport (MPI registers behind MWMS_HAVE_MPI, STYLE item 4).
#include "collective/transport/transport.h"

#include "collective/transport/shm/shm_transport.h"
#include "mwms/config.h"
#include "mwms/errors.h"
#if MWMS_HAVE_MPI
#include "collective/transport/mpi/mpi_transport.h"
#endif

namespace mwms::collective {

std::unique_ptr<Transport> make_transport(TransportKind kind, const TransportOptions& options) {
  switch (kind) {
    case TransportKind::kTcp: return nullptr;
    case TransportKind::kShm: return make_shm_transport(options);
    case TransportKind::kMpi:
#if MWMS_HAVE_MPI
      return make_mpi_transport(options);
#else
      return nullptr;  // a build without MPI
#endif
  }
  return nullptr;
}

const char* transport_name(TransportKind kind) {
  switch (kind) {
    case TransportKind::kTcp: return "tcp";
    case TransportKind::kShm: return "shm";
    case TransportKind::kMpi: return "mpi";
  }
  return "unknown";
}

std::vector<TransportKind> choose_transports(int rank,
                                             const std::vector<bootstrap::PeerInfo>& peers) {
  const std::string& mine = peers[static_cast<std::size_t>(rank)].transport;
  for (const bootstrap::PeerInfo& p : peers) {
    if (p.transport != mine) {
      throw BootstrapError("rank " + std::to_string(p.rank) + " (" + p.address +
                           ") uses transport " + p.transport + " but rank " +
                           std::to_string(rank) + " uses " + mine +
                           "; MWMS_TRANSPORT (or CommunicatorOptions::transport) must be the "
                           "same on every rank");
    }
  }
  std::vector<TransportKind> kinds(peers.size(), TransportKind::kTcp);
  const bootstrap::PeerInfo& me = peers[static_cast<std::size_t>(rank)];
  for (const bootstrap::PeerInfo& p : peers) {
    if (p.rank == rank) continue;
    const bool same_host = p.host_id == me.host_id;
    const bool both_shm = p.blobs.count("shm") > 0 && me.blobs.count("shm") > 0;
    TransportKind& k = kinds[static_cast<std::size_t>(p.rank)];
    if (mine == "tcp") {
      k = TransportKind::kTcp;
    } else if (mine == "mpi") {
      if (p.blobs.count("mpi") == 0 || me.blobs.count("mpi") == 0) {
        throw BootstrapError("MWMS_TRANSPORT=mpi, but rank " +
                             std::to_string(me.blobs.count("mpi") == 0 ? rank : p.rank) +
                             " has no MPI link: it was not started by an MPI launcher (mpirun, "
                             "srun --mpi) whose world is this cluster, or its build has no MPI");
      }
      k = TransportKind::kMpi;
    } else if (mine == "shm") {
      if (!same_host || !both_shm) {
        const bool mine_off = me.blobs.count("shm") == 0;
        const int off = mine_off ? rank : p.rank;
        throw BootstrapError(
            "transport shm was asked for (MWMS_TRANSPORT or CommunicatorOptions::transport), but " +
            (same_host ? "rank " + std::to_string(off) + " has shared memory disabled "
                         "(MWMS_SHM_DISABLE=1) or unavailable"
                       : "rank " + std::to_string(p.rank) + " (" + p.address +
                             ") is on another host than rank " + std::to_string(rank)) +
            "; use transport auto or tcp");
      }
      k = TransportKind::kShm;
    } else {
      k = same_host && both_shm ? TransportKind::kShm : TransportKind::kTcp;
    }
  }
  return kinds;
}

}  // namespace mwms::collective
