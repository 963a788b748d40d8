// Transports (STYLE items 26-27): a factory for the links of one kind. Connection setup is
// two-phase through the bootstrap: every rank publishes an opaque address blob per transport in
// the peer-info exchange (bootstrap/peer_info.h), then each transport connects the peers that
// transport_for() assigned to it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "bootstrap/peer_info.h"
#include "collective/transport/link.h"
#include "common/socket.h"

namespace mwms::collective {

/// Which transport carries the data between two ranks.
enum class TransportKind { kTcp, kShm, kMpi };
const char* transport_name(TransportKind kind);

/// What every transport's connect step gets.
struct ConnectContext {
  int rank = 0;
  int world_size = 1;
  const std::vector<bootstrap::PeerInfo>* peers = nullptr;  // by rank
  common::Deadline deadline;
  double timeout_seconds = 60;  // for messages
};

/// The transport of every pair of this rank, by peer rank (this rank's own entry is unused),
/// from what every rank published: MWMS_TRANSPORT must be the same everywhere (else
/// BootstrapError naming the two ranks); kAuto uses shared memory between ranks with the same
/// host id when both published a shm address, TCP otherwise; kShm requires one host; kMpi
/// requires every rank to have published an MPI address. Every rank computes the same kinds for
/// each pair, and the link hellos check it.
std::vector<TransportKind> choose_transports(int rank,
                                             const std::vector<bootstrap::PeerInfo>& peers);

/// What a transport factory gets (before the peer-info exchange: phase 1).
struct TransportOptions {
  int rank = 0;
  int world_size = 1;
  std::size_t chunk_bytes = 256 << 10;
  // Payload pieces of MPI links; 0: max(chunk_bytes, 4 MiB) (Note [mpi piece size]).
  std::size_t mpi_piece_bytes = 0;
  std::string job_fingerprint;  // the cluster's fingerprint (names segments, binds handshakes)
};

class Transport;
/// Creates the transport of `kind` for this rank, or returns nullptr when this build or this
/// machine does not offer it (shm disabled by MWMS_SHM_DISABLE=1, no MPI). kTcp is built from the
/// mesh instead (tcp_transport.h). @throws BackendError when it exists but cannot be set up
/// (e.g. shared memory too small, saying how large and how to disable it).
std::unique_ptr<Transport> make_transport(TransportKind kind, const TransportOptions& options);

class Transport {
 public:
  virtual ~Transport() = default;
  virtual TransportKind kind() const noexcept = 0;
  virtual const TransportCaps& caps() const noexcept = 0;
  /// This rank's address blob (phase 1), published in PeerInfo::blobs[transport_name(kind())];
  /// empty when the transport needs none (TCP uses PeerInfo::address).
  virtual std::string local_address() const = 0;
  /// Connects to every rank in `peers` (ascending); returns one link per entry, in that order.
  /// Blocks until connected or ctx.deadline. @throws BootstrapError naming the peer.
  virtual std::vector<std::unique_ptr<Link>> connect(const std::vector<int>& peers,
                                                     const ConnectContext& ctx) = 0;
};

}  // namespace mwms::collective
