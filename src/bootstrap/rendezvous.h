// TCP rendezvous (DESIGN "Bootstrap"): every rank listens at its own address; rank 0 (the leader)
// collects one hello per rank, compares each rank's view of the cluster with its own, and answers
// every rank with the ring (addresses in rank order) or with the one error that explains why the
// job cannot start. The listener stays open for the transport's ring connections.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bootstrap/handshake.h"
#include "bootstrap/peer_info.h"
#include "common/socket.h"
#include "mwms/cluster.h"

namespace mwms::bootstrap {

struct RendezvousResult {
  ResolvedCluster cluster;   // ring filled in (for MPI jobs: the endpoints exchanged)
  common::Socket listener;   // listening at cluster.ring[rank]; invalid for world size 1
  std::vector<PeerInfo> peers;  // by rank: every rank's peer info (address = ring[rank])
};

/// Runs the rendezvous for `cluster` within `connect_timeout_seconds` and exchanges `mine` (its
/// rank and address are filled in here) with every rank: the result holds every rank's PeerInfo,
/// bounds-checked, with local ranks assigned.
/// Every connection runs the handshake of bootstrap/handshake.h (with MWMS_AUTH_KEY: proves the
/// key both ways); the leader reads all hellos at once (Note [rendezvous admission]).
/// @throws BootstrapError naming task and address: listen port in use, leader unreachable, ranks
///   that never arrived (with the time waited and the hellos refused, by source address), a rank
///   whose cluster differs (naming it), a key mismatch (naming the task and the source address).
/// @throws InvalidArgument for a bad MWMS_AUTH_KEY / MWMS_AUTH_KEY_FILE.
RendezvousResult rendezvous(const ResolvedCluster& cluster, double connect_timeout_seconds,
                            PeerInfo mine = {});

// The frames (MessageKind, send_message, recv_message) and the handshake that opens every
// connection live in bootstrap/handshake.h (Note [auth handshake]).

/// Exchanges `mine` among all MPI ranks (MPI_Allgather on MPI_COMM_WORLD), acquiring MPI from its
/// one owner (bootstrap/mpi_runtime.h: initialised when needed, finalised only at process exit).
/// @throws BootstrapError when built without MPI; BackendError when MPI fails.
std::vector<std::string> mpi_allgather_strings(const std::string& mine);

}  // namespace mwms::bootstrap
