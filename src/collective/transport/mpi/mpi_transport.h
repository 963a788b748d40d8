// The MPI transport: every pair's messages as MPI point-to-point messages (MpiLink) on a private
// duplicate of MPI_COMM_WORLD, our algorithms on top. Compiled only with MWMS_WITH_MPI; its table
// row (mpi_entry.cc, built everywhere) creates it. MPI itself is acquired from its one
// owner (bootstrap/mpi_runtime.h, Note [mpi ownership]); the rendezvous, the TCP control plane
// (aborts, stall blame, a dead peer's closed socket) and the mesh stay what they are for every
// transport.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "bootstrap/mpi_runtime.h"
#include "collective/transport/transport.h"

namespace mwms::collective {

/// The MPI transport of this process, or nullptr when it was not started by an MPI launcher
/// (no OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK) or the MPI world is not this cluster (its
/// size differs from options.world_size). Acquires (and so may initialise) MPI.
/// @throws BackendError when MPI cannot be initialised.
std::unique_ptr<Transport> make_mpi_transport(const TransportOptions& options);

class MpiTransport final : public Transport {
 public:
  /// Payload pieces of `chunk_bytes` (capped below INT_MAX: MPI counts are int).
  MpiTransport(bootstrap::MpiRuntime& runtime, const TransportOptions& options);
  const TransportCaps& caps() const noexcept override { return caps_; }
  /// "<MPI world rank>:<chunk bytes>": our rank may differ from the MPI rank (TF_CONFIG orders
  /// the tasks), and both sides must cut payloads at the same offsets.
  std::string local_address() const override;
  /// Duplicates MPI_COMM_WORLD (collective over the whole MPI world, which make_mpi_transport
  /// checked is this cluster: every rank gets here once the exchange showed that every rank
  /// chose MPI; MPI_Comm_dup itself takes no deadline) and makes one link per peer.
  /// @throws BootstrapError for a peer's malformed blob or different chunk size; BackendError
  ///   when MPI fails.
  std::vector<std::unique_ptr<Link>> connect(const std::vector<int>& peers,
                                             const ConnectContext& ctx) override;

 private:
  bootstrap::MpiRuntime& runtime_;
  int rank_;
  int world_size_;
  std::size_t chunk_bytes_;
  TransportCaps caps_;
};

}  // namespace mwms::collective
