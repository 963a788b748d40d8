// Ring formation over TCP (two-phase through bootstrap, STYLE item 27): after the rendezvous every
// rank knows every listen address; it connects a data and a control connection to its successor
// and accepts the same two from its predecessor on its own listener.
#pragma once

#include <memory>

#include "bootstrap/rendezvous.h"
#include "collective/transport/tcp/tcp_ring_channel.h"

namespace mwms::collective {

struct TcpRingOptions {
  double connect_timeout_seconds = 60;
  std::size_t chunk_bytes = 256 << 10;
  double spin_seconds = 50e-6;
};

/// Builds the channel of rank cluster.task_id. @throws BootstrapError naming the neighbour that
/// could not be reached or never connected, and the time waited.
std::unique_ptr<TcpRingChannel> connect_tcp_ring(const ResolvedCluster& cluster,
                                                 const common::Socket& listener,
                                                 const TcpRingOptions& options);

}  // namespace mwms::collective
