#include "collective/transport/tcp/tcp_transport.h"

#include <nlohmann/json.hpp>
#include <optional>

#include "bootstrap/handshake.h"
#include "collective/transport/tcp/tcp_link.h"
#include "common/logging.h"
#include "mwms/errors.h"

namespace mwms::collective {

namespace {

using bootstrap::MessageKind;
using nlohmann::json;

ErrorContext mesh_context(const ResolvedCluster& c, int peer) {
  ErrorContext ctx;
  ctx.rank = c.task_id;
  ctx.world_size = c.num_workers;
  ctx.task = c.task_name();
  ctx.op = "link setup";
  ctx.transport = "tcp";
  ctx.peer_rank = peer;
  ctx.peer_task = c.task_name_of_rank(peer);
  ctx.peer_address = c.ring[static_cast<std::size_t>(peer)];
  return ctx;
}

common::Socket connect_to(const ResolvedCluster& c, int peer, MessageKind kind,
                          TransportKind transport, common::Deadline deadline, double timeout) {
  const std::string& address = c.ring[static_cast<std::size_t>(peer)];
  auto [host, port] = split_address(address);
  std::string error;
  common::Socket s = common::connect_tcp(host, port, deadline, &error);
  if (!s.valid()) {
    throw BootstrapError(c.task_name() + " could not connect to " + c.task_name_of_rank(peer) +
                             " at " + address + " within " +
                             std::to_string(static_cast<int>(timeout)) + " s: " + error,
                         mesh_context(c, peer));
  }
  // Note [auth handshake]: the claims (rank, fingerprint, link kind, transport) are covered by
  // the key's proofs when MWMS_AUTH_KEY is set. The lower rank answers once it accepts, after
  // its own connects to the ranks below it, so this waits up to the link deadline.
  bootstrap::HandshakeClaim claim{kind, c.task_id, c.cluster.fingerprint(),
                                  json{{"transport", transport_name(transport)}}.dump()};
  bootstrap::ConnectOutcome o =
      bootstrap::connect_handshake(s.fd(), bootstrap::auth_key_from_env(), claim, deadline);
  if (o.status != bootstrap::ConnectOutcome::Status::kOk) {
    std::string why = o.status == bootstrap::ConnectOutcome::Status::kIo ? o.io.describe() : o.detail;
    if (o.status == bootstrap::ConnectOutcome::Status::kKeyMismatch) {
      why = "key mismatch (" + why + "): every task must have the same MWMS_AUTH_KEY";
    }
    throw BootstrapError(c.task_name() + " could not open its " +
                             (kind == MessageKind::kRingData ? "data" : "control") + " link to " +
                             c.task_name_of_rank(peer) + " at " + address + ": " + why,
                         mesh_context(c, peer));
  }
  return s;
}

// Accepts connections until every higher rank has connected its control link and, where the
// pair uses TCP, its data link. Handshakes run concurrently (bootstrap::HandshakeServer); a
// connection that fails one, or is not from a higher rank of this cluster, is logged with its
// real source address and dropped.
void accept_from_higher(const ResolvedCluster& c, const common::Socket& listener,
                        const std::vector<TransportKind>& kinds, common::Deadline deadline,
                        double timeout, MeshSockets* out) {
  const int n = c.num_workers;
  auto missing = [&]() {
    std::string list;
    for (int p = c.task_id + 1; p < n; ++p) {
      bool need_data = kinds[static_cast<std::size_t>(p)] == TransportKind::kTcp;
      if (!out->control[static_cast<std::size_t>(p)].valid() ||
          (need_data && !out->data[static_cast<std::size_t>(p)].valid())) {
        list += (list.empty() ? "" : ", ") + c.task_name_of_rank(p) + " (" +
                c.ring[static_cast<std::size_t>(p)] + ")";
      }
    }
    return list;
  };
  bootstrap::HandshakeServer server(listener, bootstrap::auth_key_from_env(),
                                    {MessageKind::kRingData, MessageKind::kRingControl}, 3.0);
  while (!missing().empty()) {
    std::optional<bootstrap::HandshakeEvent> ev = server.next(deadline);
    if (!ev) {
      throw BootstrapError(c.task_name() + " waited " + std::to_string(static_cast<int>(timeout)) +
                               " s for its links; never connected: " + missing(),
                           mesh_context(c, n - 1));
    }
    if (!ev->ok) {
      MWMS_LOG_WARN(kRing, "refused a link connection from "
                               << ev->source
                               << (ev->claim.rank >= 0
                                       ? " claiming rank " + std::to_string(ev->claim.rank)
                                       : std::string())
                               << ": " << ev->reason);
      continue;
    }
    const int peer = ev->claim.rank;
    const MessageKind kind = ev->claim.kind;
    json hello = json::parse(ev->claim.hello, nullptr, false);
    bool valid = ev->claim.fingerprint == c.cluster.fingerprint() && hello.is_object() &&
                 hello.contains("transport") && hello["transport"].is_string();
    if (!valid || peer <= c.task_id || peer >= n) {
      MWMS_LOG_WARN(kRing, "ignoring a link connection from "
                               << ev->source << " that is not from a higher rank of this "
                               << "cluster (claims rank " << peer << ")");
      continue;
    }
    const char* ours = transport_name(kinds[static_cast<std::size_t>(peer)]);
    if (hello["transport"].get<std::string>() != ours) {
      throw BootstrapError(c.task_name_of_rank(peer) + " chose transport " +
                               hello["transport"].get<std::string>() + " for its link to " +
                               c.task_name() + ", which chose " + ours +
                               " (MWMS_TRANSPORT and MWMS_SHM_DISABLE must agree on every rank)",
                           mesh_context(c, peer));
    }
    auto& slot = kind == MessageKind::kRingData ? out->data : out->control;
    if (kind == MessageKind::kRingData && kinds[static_cast<std::size_t>(peer)] != TransportKind::kTcp) {
      continue;
    }
    if (!slot[static_cast<std::size_t>(peer)].valid()) {
      slot[static_cast<std::size_t>(peer)] = std::move(ev->socket);
    }
  }
}

}  // namespace

MeshSockets connect_mesh(const ResolvedCluster& c, const common::Socket& listener,
                         const std::vector<TransportKind>& kinds, double timeout_seconds) {
  const int n = c.num_workers;
  MeshSockets out;
  out.control.resize(static_cast<std::size_t>(n));
  out.data.resize(static_cast<std::size_t>(n));
  common::Deadline deadline = common::deadline_after(timeout_seconds);
  // Connect to every lower rank first (their listeners queue us), then accept the higher ones.
  for (int p = 0; p < c.task_id; ++p) {
    TransportKind k = kinds[static_cast<std::size_t>(p)];
    out.control[static_cast<std::size_t>(p)] =
        connect_to(c, p, MessageKind::kRingControl, k, deadline, timeout_seconds);
    if (k == TransportKind::kTcp) {
      out.data[static_cast<std::size_t>(p)] =
          connect_to(c, p, MessageKind::kRingData, k, deadline, timeout_seconds);
    }
  }
  accept_from_higher(c, listener, kinds, deadline, timeout_seconds, &out);
  for (auto* v : {&out.control, &out.data}) {
    for (common::Socket& s : *v) {
      if (s.valid()) common::tune_stream_socket(s.fd());
    }
  }
  MWMS_LOG_DEBUG(kRing, "links connected to " << n - 1 << " peers");
  return out;
}

TcpTransport::TcpTransport(std::vector<common::Socket> data, std::size_t chunk_bytes)
    : data_(std::move(data)), caps_(tcp_caps(chunk_bytes)) {}

std::vector<std::unique_ptr<Link>> TcpTransport::connect(const std::vector<int>& peers,
                                                         const ConnectContext&) {
  std::vector<std::unique_ptr<Link>> links;
  for (int p : peers) {
    MWMS_CHECK(data_[static_cast<std::size_t>(p)].valid(), "no TCP socket for rank " + std::to_string(p));
    links.push_back(std::make_unique<TcpLink>(p, std::move(data_[static_cast<std::size_t>(p)])));
  }
  return links;
}

}  // namespace mwms::collective
