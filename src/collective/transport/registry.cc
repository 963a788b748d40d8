// The transport table (Note [transport table]): the one place that lists every transport. A new
// transport is its folder plus one line here.
#include "collective/transport/transport.h"

#include <algorithm>

#include "collective/transport/mem/mem_transport.h"
#include "collective/transport/mpi/mpi_entry.h"
#include "collective/transport/shm/shm_transport.h"
#include "collective/transport/tcp/tcp_transport.h"
#include "mwms/errors.h"

namespace mwms::collective {

const std::vector<TransportEntry>& transport_table() {
  // Constant-initialised rows, copied on first use (no static initialisation order to mind).
  // The order is that of MWMS_TRANSPORT's values in messages and of connecting; which transport a
  // pair takes under auto is the entries' priority.
  static const std::vector<TransportEntry> table{
      kTcpTransportEntry,  // "tcp": every pair, over the mesh's sockets (the last resort)
      kShmTransportEntry,  // "shm": ranks of one host, over shared-memory rings
      kMpiTransportEntry,  // "mpi": MPI point-to-point under mpirun (MWMS_TRANSPORT=mpi)
      kMemTransportEntry,  // "mem": threads of one process (tests, embedders)
  };
  return table;
}

const TransportEntry* find_transport(std::string_view name) {
  for (const TransportEntry& e : transport_table()) {
    if (name == e.name) return &e;
  }
  return nullptr;
}

std::string transport_choices() {
  std::string out = "auto";
  for (const TransportEntry& e : transport_table()) {
    // Test-only entries ("mem") stay out of the values offered to users.
    if (e.user_selectable) out += std::string("|") + e.name;
  }
  return out;
}

void check_transport_choice(const std::string& value) {
  const TransportEntry* e = find_transport(value);
  // Called where MWMS_TRANSPORT is read, so a typo fails before any transport is created.
  if (value != "auto" && (e == nullptr || !e->user_selectable)) {
    throw InvalidArgument("MWMS_TRANSPORT=" + value + " is not one of " + transport_choices());
  }
}

ErrorContext ConnectContext::error_context(int peer) const {
  ErrorContext c;
  c.rank = rank;
  c.world_size = world_size;
  c.op = "link setup";
  // task_names may be empty (mpirun jobs, tests): errors then say "rank N".
  auto name = [&](int r) {
    return static_cast<std::size_t>(r) < task_names.size() ? task_names[static_cast<std::size_t>(r)]
                                                         : "rank " + std::to_string(r);
  };
  c.task = name(rank);
  if (peer >= 0) {
    c.peer_rank = peer;
    c.peer_task = name(peer);
    if (peers != nullptr && static_cast<std::size_t>(peer) < peers->size()) {
      c.peer_address = (*peers)[static_cast<std::size_t>(peer)].address;
    }
  }
  return c;
}

std::vector<const TransportEntry*> choose_transports(
    int rank, const std::vector<bootstrap::PeerInfo>& peers) {
  const bootstrap::PeerInfo& me = peers[static_cast<std::size_t>(rank)];
  const std::string& mine = me.transport;
  // Every rank runs this on the same published data and must pick the same entry for each pair;
  // that holds only if all ranks filter the table alike, so a differing choice fails here, on
  // every rank, before anything connects.
  for (const bootstrap::PeerInfo& p : peers) {
    if (p.transport != mine) {
      throw BootstrapError("rank " + std::to_string(p.rank) + " (" + p.address +
                           ") uses transport " + p.transport + " but rank " +
                           std::to_string(rank) + " uses " + mine +
                           "; MWMS_TRANSPORT (or CommunicatorOptions::transport) must be the "
                           "same on every rank");
    }
  }
  const TransportEntry* forced = mine == "auto" ? nullptr : find_transport(mine);
  // The factory checked this rank's value when it read it; this guards a direct caller, which
  // gets an error here instead of a null entry below.
  if (mine != "auto" && forced == nullptr) {
    throw BootstrapError("rank " + std::to_string(rank) + " asks for transport " + mine +
                         ", which is not one of " + transport_choices());
  }
  // The automatic entries by priority, highest first (stable: equal priorities keep table order).
  std::vector<const TransportEntry*> candidates;
  for (const TransportEntry& e : transport_table()) {
    if (e.automatic) candidates.push_back(&e);
  }
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const TransportEntry* a, const TransportEntry* b) {
                     return a->priority > b->priority;
                   });
  std::vector<const TransportEntry*> chosen(peers.size(), nullptr);
  for (const bootstrap::PeerInfo& p : peers) {
    if (p.rank == rank) continue;
    const TransportEntry*& pick = chosen[static_cast<std::size_t>(p.rank)];
    if (forced != nullptr) {
      // A forced transport never falls back: the user asked for it, so a pair it cannot carry is
      // an error naming the pair, not a silent switch to another transport.
      const std::string why = forced->cannot_connect(me, p);
      if (!why.empty()) {
        throw BootstrapError("transport " + mine + " was asked for (MWMS_TRANSPORT or "
                             "CommunicatorOptions::transport), but " + why +
                             "; use another transport (" + transport_choices() + ")");
      }
      pick = forced;
      continue;
    }
    std::string whys;  // every refusal, so that a pair nothing carries says why for each entry
    for (const TransportEntry* e : candidates) {
      const std::string why = e->cannot_connect(me, p);
      if (why.empty()) {
        pick = e;
        break;
      }
      whys += std::string(whys.empty() ? "" : "; ") + e->name + ": " + why;
    }
    if (pick == nullptr) {
      throw BootstrapError("no transport connects rank " + std::to_string(rank) + " and rank " +
                           std::to_string(p.rank) + " (" + p.address + "): " + whys);
    }
  }
  return chosen;
}

}  // namespace mwms::collective
