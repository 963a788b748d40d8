#include "collective/transport/tcp/tcp_transport.h"

#include <nlohmann/json.hpp>

#include "bootstrap/rendezvous.h"
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
  auto [host, port] = split_address(c.ring[static_cast<std::size_t>(peer)]);
  std::string error;
  common::Socket s = common::connect_tcp(host, port, deadline, &error);
  json hello{{"rank", c.task_id},
             {"fingerprint", c.cluster.fingerprint()},
             {"transport", transport_name(transport)}};
  if (!s.valid() ||
      bootstrap::send_message(s.fd(), kind, hello.dump(), deadline).status != common::IoStatus::kOk) {
    throw BootstrapError(c.task_name() + " could not connect to " + c.task_name_of_rank(peer) +
                             " at " + c.ring[static_cast<std::size_t>(peer)] + " within " +
                             std::to_string(static_cast<int>(timeout)) + " s: " + error,
                         mesh_context(c, peer));
  }
  return s;
}

// Accepts connections until every higher rank has connected its control link and, where the
// pair uses TCP, its data link.
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
  while (!missing().empty()) {
    common::IoResult r;
    common::Socket s = common::accept_until(listener, deadline, &r);
    if (!s.valid()) {
      throw BootstrapError(c.task_name() + " waited " + std::to_string(static_cast<int>(timeout)) +
                               " s for its links; never connected: " + missing() + " (" +
                               r.describe() + ")",
                           mesh_context(c, n - 1));
    }
    MessageKind kind;
    std::string text;
    // A peer sends its hello right after connecting; a silent or foreign client must not hold
    // up link setup.
    common::Deadline hello_deadline = std::min(deadline, common::deadline_after(3.0));
    if (bootstrap::recv_message(s.fd(), &kind, &text, hello_deadline).status !=
        common::IoStatus::kOk) {
      MWMS_LOG_WARN(kRing, "ignoring a connection that sent no link hello");
      continue;
    }
    json hello = json::parse(text, nullptr, false);
    bool valid = hello.is_object() && hello.contains("rank") && hello["rank"].is_number_integer() &&
                 hello.contains("fingerprint") && hello["fingerprint"].is_string() &&
                 hello["fingerprint"].get<std::string>() == c.cluster.fingerprint() &&
                 hello.contains("transport") && hello["transport"].is_string();
    int peer = valid ? hello["rank"].get<int>() : -1;
    if (!valid || peer <= c.task_id || peer >= n ||
        (kind != MessageKind::kRingData && kind != MessageKind::kRingControl)) {
      MWMS_LOG_WARN(kRing, "ignoring a link connection that is not from a higher rank of this "
                           "cluster: " << text.substr(0, 200));
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
    if (!slot[static_cast<std::size_t>(peer)].valid()) slot[static_cast<std::size_t>(peer)] = std::move(s);
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
