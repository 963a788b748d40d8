// Transports (STYLE items 26-27) and the transport table (Note [transport table]). Connection
// setup is two-phase through the bootstrap: every rank creates the transports it may use and
// publishes an address blob per transport in the peer-info exchange (bootstrap/peer_info.h);
// then every rank picks one transport per pair from what both ends published
// (choose_transports) and each transport connects the peers assigned to it.
//
// Note [transport table]: a transport describes itself in one TransportEntry (after NCCL's
// `struct ncclTransport`: a name, canConnect, setup/connect), and transport/registry.cc lists
// the entries. Nothing else in the library names a transport: the communicator factory walks
// the table (create, publish, choose, check, connect), the socket mesh opens the sockets a
// transport asks for (Transport::mesh_sockets_per_peer), the descriptor budget asks each entry
// what a pair costs, and the selector reads the links' capabilities (TransportEntry::tuning
// through Topology::links), never a transport's name. So adding a transport is its folder (its sources listed in
// src/collective/CMakeLists.txt) plus one line in the table. MWMS_TRANSPORT (or
// CommunicatorOptions::transport) filters the table: "auto" gives each pair the entry of highest
// priority among the automatic ones whose can_connect holds for the pair; a name forces that
// entry for every pair and fails naming the pair it cannot connect.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "bootstrap/peer_info.h"
#include "collective/link_tuning.h"
#include "collective/transport/link.h"
#include "common/descriptors.h"
#include "common/socket.h"
#include "mwms/errors.h"

namespace mwms::collective {

/// What every transport's connect step gets.
struct ConnectContext {
  int rank = 0;
  int world_size = 1;
  const std::vector<bootstrap::PeerInfo>* peers = nullptr;  // by rank
  common::Deadline deadline;
  double timeout_seconds = 60;  // for messages
  /// By rank: the sockets the mesh opened for this transport's pairs (mesh_sockets_per_peer()
  /// of them, in stream order; empty elsewhere). connect() may move them out.
  std::vector<std::vector<common::Socket>>* sockets = nullptr;
  std::vector<std::string> task_names;  // by rank ("worker 1"); empty: "rank N" in errors

  /// The ErrorContext of link setup between this rank and `peer` (-1: none); its transport is
  /// left for the caller to name.
  ErrorContext error_context(int peer) const;
};

/// What a transport factory gets (before the peer-info exchange: phase 1).
struct TransportOptions {
  int rank = 0;
  int world_size = 1;
  std::size_t chunk_bytes = 256 << 10;
  // Payload pieces of MPI links; 0: max(chunk_bytes, 4 MiB) (Note [mpi piece size]).
  std::size_t mpi_piece_bytes = 0;
  std::string job_fingerprint;  // the cluster's fingerprint (names segments, binds handshakes)
  // False when every peer is surely on another host (Note [local peers before the exchange]):
  // a transport between ranks of one host then makes nothing to publish.
  bool may_share_host = true;
};

/// One transport of one rank, created in phase 1 by its table entry.
class Transport {
 public:
  virtual ~Transport() = default;
  /// What its links offer; caps().name is the table entry's name.
  virtual const TransportCaps& caps() const noexcept = 0;
  /// This rank's address blob (phase 1), published in PeerInfo::blobs[entry name]. Never empty:
  /// a peer that did not publish one does not offer the transport (can_connect).
  virtual std::string local_address() const = 0;
  /// How many sockets of the mesh (collective/mesh/socket_mesh.h) each pair this transport
  /// carries needs, opened and authenticated with the control links and handed to connect() in
  /// ConnectContext::sockets; 0 (the default): none. Must be the same on both ends of a pair
  /// (check_peers makes sure).
  virtual int mesh_sockets_per_peer() const noexcept { return 0; }
  /// Compares this rank's settings with the blobs of `peers` (ascending) before anything
  /// connects, so that both ends of a pair that disagree fail at once with the same text. Does
  /// not block. @throws BootstrapError naming the peer and the setting.
  virtual void check_peers(const std::vector<int>& peers, const ConnectContext& ctx) const {
    (void)peers;
    (void)ctx;
  }
  /// Connects to every rank in `peers` (ascending); returns one link per entry, in that order.
  /// Blocks until connected or ctx.deadline. @throws BootstrapError naming the peer.
  virtual std::vector<std::unique_ptr<Link>> connect(const std::vector<int>& peers,
                                                     const ConnectContext& ctx) = 0;
};

/// One row of the transport table (Note [transport table]). Every function is called on every
/// rank with the same peer infos and must decide alike (the selector depends on it).
struct TransportEntry {
  /// MWMS_TRANSPORT value, PeerInfo blob key, link hello field and the name in errors and logs.
  const char* name;
  /// Under auto, the pair takes the automatic entry of highest priority that can connect it.
  int priority;
  /// Whether auto considers it (false: only when MWMS_TRANSPORT names it).
  bool automatic;
  /// Whether MWMS_TRANSPORT and CommunicatorOptions::transport may name it (false: an entry for
  /// tests and embedders, such as the in-memory transport between threads of one process).
  bool user_selectable;
  /// Phase 1: this rank's transport, or nullptr when this build, this machine or a setting does
  /// not offer it (then the rank publishes no blob for it). @throws BackendError when it exists
  /// but cannot be set up, InvalidArgument for a bad setting.
  std::unique_ptr<Transport> (*create)(const TransportOptions& options);
  /// Empty when the pair (`me`, `peer`) can use it, from what both published; otherwise why not,
  /// as a sentence for the error of a forced transport. Symmetric in `me` and `peer`.
  std::string (*cannot_connect)(const bootstrap::PeerInfo& me, const bootstrap::PeerInfo& peer);
  /// Adds what one peer over this transport costs to `budget` (Note [descriptor budget]);
  /// nullptr: nothing of ours.
  void (*count_descriptors)(common::DescriptorBudget& budget);
  /// Where the selector's thresholds lie over its links (read through Topology::links).
  LinkTuning tuning;
};

/// The table, in registration order (transport/registry.cc).
const std::vector<TransportEntry>& transport_table();

/// The entry named `name`, or nullptr.
const TransportEntry* find_transport(std::string_view name);

/// "auto|" and the user-selectable names of the table, '|'-separated (MWMS_TRANSPORT's values).
std::string transport_choices();

/// Checks a MWMS_TRANSPORT value against the table.
/// @throws InvalidArgument "MWMS_TRANSPORT=<value> is not one of auto|tcp|shm|mpi".
void check_transport_choice(const std::string& value);

/// The entry carrying each pair of `rank`, by peer rank (nullptr at `rank`), from what every rank
/// published (Note [transport table]). PeerInfo::transport must be the same on every rank (else
/// BootstrapError naming the two ranks); a forced entry that cannot connect a pair, or a pair no
/// automatic entry connects, is a BootstrapError naming the pair. Every rank computes the same
/// entry for each pair, and the link hellos check it.
std::vector<const TransportEntry*> choose_transports(
    int rank, const std::vector<bootstrap::PeerInfo>& peers);

}  // namespace mwms::collective
