#include "collective/mesh/socket_mesh.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "bootstrap/error_context.h"
#include "bootstrap/handshake.h"
#include "common/logging.h"
#include "mwms/errors.h"

namespace mwms::collective {

namespace {

using bootstrap::MessageKind;
using nlohmann::json;

ErrorContext mesh_context(const ResolvedCluster& c, int peer) {
  ErrorContext ctx = bootstrap::peer_context(c, "link setup", peer);
  ctx.transport = "tcp";  // the mesh's connections are TCP, whatever carries the pair's data
  return ctx;
}

common::Socket connect_to(const ResolvedCluster& c, int peer, MessageKind kind,
                          const std::string& transport, common::Deadline deadline, double timeout,
                          int stream = 0, int streams = 1) {
  const std::string& address = c.ring[static_cast<std::size_t>(peer)];
  auto [host, port] = split_address(address);
  std::string error;
  bool exhausted = false;
  common::Socket s = common::connect_tcp(host, port, deadline, &error, &exhausted);
  if (!s.valid() && exhausted) {  // Note [descriptor budget]: not a timeout, and no wait
    throw BootstrapError(c.task_name() + " could not connect to " + c.task_name_of_rank(peer) +
                             " at " + address + ": " + error,
                         mesh_context(c, peer));
  }
  if (!s.valid()) {
    throw BootstrapTimeoutError(c.task_name() + " could not connect to " +
                                    c.task_name_of_rank(peer) +
                             " at " + address + " within " +
                             std::to_string(static_cast<int>(timeout)) + " s: " + error,
                         mesh_context(c, peer));
  }
  // Note [auth handshake]: the claims (rank, fingerprint, link kind, transport, stream) are
  // covered by the key's proofs when MWMS_AUTH_KEY is set. The lower rank answers once it
  // accepts, after its own connects to the ranks below it, so this waits up to the link deadline.
  json hello{{"transport", transport}};
  if (kind == MessageKind::kRingData) {  // which of the pair's sockets (Note [tcp stripes])
    hello["stream"] = stream;
    hello["streams"] = streams;
  }
  bootstrap::HandshakeClaim claim{kind, c.task_id, c.cluster.fingerprint(), hello.dump()};
  bootstrap::ConnectOutcome o =
      bootstrap::connect_handshake(s.fd(), bootstrap::auth_key_from_env(), claim, deadline);
  if (o.status != bootstrap::ConnectOutcome::Status::kOk) {
    std::string why = o.status == bootstrap::ConnectOutcome::Status::kIo ? o.io.describe() : o.detail;
    if (o.status == bootstrap::ConnectOutcome::Status::kKeyMismatch) {
      why = "key mismatch (" + bootstrap::mismatch_detail(o) +
            "): every task must have the same MWMS_AUTH_KEY";
    }
    throw BootstrapError(c.task_name() + " could not open its " +
                             (kind == MessageKind::kRingData ? "data" : "control") + " link to " +
                             c.task_name_of_rank(peer) + " at " + address + ": " + why,
                         mesh_context(c, peer));
  }
  return s;
}

// Accepts connections until every higher rank has connected its control link and the sockets
// its pair's transport asked for. Handshakes run concurrently (bootstrap::HandshakeServer); a
// connection that fails one, or is not from a higher rank of this cluster, is logged with its
// real source address and dropped.
void accept_from_higher(const ResolvedCluster& c, const common::Socket& listener,
                        const MeshPlan& plan, common::Deadline deadline, double timeout,
                        MeshSockets* out) {
  const int n = c.num_workers;
  auto missing = [&]() {
    std::string list;
    for (int p = c.task_id + 1; p < n; ++p) {
      const auto& data = out->data[static_cast<std::size_t>(p)];
      bool have_data = std::all_of(data.begin(), data.end(),
                                   [](const common::Socket& s) { return s.valid(); });
      if (!out->control[static_cast<std::size_t>(p)].valid() || !have_data) {
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
      throw BootstrapTimeoutError(c.task_name() + " waited " +
                                      std::to_string(static_cast<int>(timeout)) +
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
    const std::string& ours = plan.transport[static_cast<std::size_t>(peer)];
    if (hello["transport"].get<std::string>() != ours) {
      throw BootstrapError(c.task_name_of_rank(peer) + " chose transport " +
                               hello["transport"].get<std::string>() + " for its link to " +
                               c.task_name() + ", which chose " + ours +
                               " (MWMS_TRANSPORT and MWMS_SHM_DISABLE must agree on every rank)",
                           mesh_context(c, peer));
    }
    if (kind == MessageKind::kRingControl) {
      if (!out->control[static_cast<std::size_t>(peer)].valid()) {
        out->control[static_cast<std::size_t>(peer)] = std::move(ev->socket);
      }
      continue;
    }
    const int streams = plan.sockets[static_cast<std::size_t>(peer)];
    if (streams == 0) continue;
    auto field = [&](const char* key, int absent) {
      return hello.contains(key) && hello[key].is_number_integer() ? hello[key].get<int>() : absent;
    };
    const int theirs = field("streams", 1);
    const int stream = field("stream", -1);
    if (theirs != streams) {
      throw BootstrapError(c.task_name_of_rank(peer) + " opens " + std::to_string(theirs) +
                               " " + ours + " socket(s) to " + c.task_name() +
                               ", which expects " + std::to_string(streams) +
                               " (its settings, such as MWMS_NSOCKS_PERPEER for tcp, must be "
                               "the same on every rank)",
                           mesh_context(c, peer));
    }
    auto& data = out->data[static_cast<std::size_t>(peer)];
    if (stream >= 0 && stream < streams && !data[static_cast<std::size_t>(stream)].valid()) {
      data[static_cast<std::size_t>(stream)] = std::move(ev->socket);
    }
  }
}

}  // namespace

MeshSockets connect_mesh(const ResolvedCluster& c, const common::Socket& listener,
                         const MeshPlan& plan, double timeout_seconds) {
  const int n = c.num_workers;
  MWMS_CHECK(static_cast<int>(plan.transport.size()) == n &&
                 static_cast<int>(plan.sockets.size()) == n,
             "mesh plan of another world size");
  MeshSockets out;
  out.control.resize(static_cast<std::size_t>(n));
  out.data.resize(static_cast<std::size_t>(n));
  for (int p = 0; p < n; ++p) {
    if (p != c.task_id) {
      out.data[static_cast<std::size_t>(p)].resize(
          static_cast<std::size_t>(plan.sockets[static_cast<std::size_t>(p)]));
    }
  }
  common::Deadline deadline = common::deadline_after(timeout_seconds);
  // Connect to every lower rank first (their listeners queue us), then accept the higher ones.
  for (int p = 0; p < c.task_id; ++p) {
    const std::string& t = plan.transport[static_cast<std::size_t>(p)];
    const int k = plan.sockets[static_cast<std::size_t>(p)];
    out.control[static_cast<std::size_t>(p)] =
        connect_to(c, p, MessageKind::kRingControl, t, deadline, timeout_seconds);
    for (int i = 0; i < k; ++i) {
      out.data[static_cast<std::size_t>(p)][static_cast<std::size_t>(i)] =
          connect_to(c, p, MessageKind::kRingData, t, deadline, timeout_seconds, i, k);
    }
  }
  accept_from_higher(c, listener, plan, deadline, timeout_seconds, &out);
  for (common::Socket& s : out.control) {
    if (s.valid()) common::tune_stream_socket(s.fd());
  }
  MWMS_LOG_DEBUG(kRing, "links connected to " << n - 1 << " peers");
  return out;
}

}  // namespace mwms::collective
