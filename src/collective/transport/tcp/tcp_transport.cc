#include "collective/transport/tcp/tcp_transport.h"

#include <sys/socket.h>

#include <algorithm>
#include <utility>

#include <nlohmann/json.hpp>
#include <optional>

#include "bootstrap/handshake.h"
#include "collective/transport/tcp/tcp_link.h"
#include "common/env.h"
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
                          TransportKind transport, common::Deadline deadline, double timeout,
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
  json hello{{"transport", transport_name(transport)}};
  if (kind == MessageKind::kRingData) {  // Note [tcp stripes]: which of the pair's streams
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

// Accepts connections until every higher rank has connected its control link and, where the
// pair uses TCP, its data links. Handshakes run concurrently (bootstrap::HandshakeServer); a
// connection that fails one, or is not from a higher rank of this cluster, is logged with its
// real source address and dropped.
void accept_from_higher(const ResolvedCluster& c, const common::Socket& listener,
                        const std::vector<TransportKind>& kinds, common::Deadline deadline,
                        double timeout, int streams, MeshSockets* out) {
  const int n = c.num_workers;
  auto missing = [&]() {
    std::string list;
    for (int p = c.task_id + 1; p < n; ++p) {
      bool need_data = kinds[static_cast<std::size_t>(p)] == TransportKind::kTcp;
      const auto& data = out->data[static_cast<std::size_t>(p)];
      bool have_data = std::all_of(data.begin(), data.end(),
                                   [](const common::Socket& s) { return s.valid(); });
      if (!out->control[static_cast<std::size_t>(p)].valid() || (need_data && !have_data)) {
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
    const char* ours = transport_name(kinds[static_cast<std::size_t>(peer)]);
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
    if (kinds[static_cast<std::size_t>(peer)] != TransportKind::kTcp) continue;
    auto field = [&](const char* key, int absent) {
      return hello.contains(key) && hello[key].is_number_integer() ? hello[key].get<int>() : absent;
    };
    const int theirs = field("streams", 1);
    const int stream = field("stream", -1);
    if (theirs != streams) {
      throw BootstrapError(c.task_name_of_rank(peer) + " opens " + std::to_string(theirs) +
                               " TCP stream(s) to " + c.task_name() + ", which expects " +
                               std::to_string(streams) +
                               " (MWMS_NSOCKS_PERPEER must be the same on every rank)",
                           mesh_context(c, peer));
    }
    auto& data = out->data[static_cast<std::size_t>(peer)];
    if (stream >= 0 && stream < streams && !data[static_cast<std::size_t>(stream)].valid()) {
      data[static_cast<std::size_t>(stream)] = std::move(ev->socket);
    }
  }
}

// Note [socket buffers]: by default (MWMS_SOCKET_BUFFER_BYTES=0) Linux autotunes each socket's
// buffers within net.ipv4.tcp_wmem/tcp_rmem (kernel defaults: up to 4 MiB / 6 MiB), growing them
// with the measured bandwidth-delay product. Setting SO_SNDBUF/SO_RCVBUF fixes them and turns
// that autotuning off for the socket; the kernel doubles the value (bookkeeping overhead) and
// caps it at net.core.wmem_max/rmem_max (212992 by default) unless the process may use the
// *FORCE options (CAP_NET_ADMIN), which is tried first. The receive window's scale is agreed at
// connect time from the system limits, so sizing after connect still opens a large window.
void size_socket_buffers(int fd, int bytes) {
  for (auto [force, plain] :
       {std::pair{SO_SNDBUFFORCE, SO_SNDBUF}, std::pair{SO_RCVBUFFORCE, SO_RCVBUF}}) {
    if (::setsockopt(fd, SOL_SOCKET, force, &bytes, sizeof(bytes)) != 0) {
      ::setsockopt(fd, SOL_SOCKET, plain, &bytes, sizeof(bytes));
    }
  }
  int snd = 0, rcv = 0;
  socklen_t len = sizeof(int);
  ::getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &snd, &len);
  len = sizeof(int);
  ::getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcv, &len);
  MWMS_LOG_DEBUG(kNet, "socket buffers asked " << bytes << " got send " << snd << " receive "
                                                << rcv);
}

}  // namespace

int tcp_streams_per_peer() {
  const long long k = common::env_int("MWMS_NSOCKS_PERPEER");
  if (k < 1 || k > TcpLink::kMaxStreams) {
    throw InvalidArgument("MWMS_NSOCKS_PERPEER=" + std::to_string(k) + " is outside 1.." +
                          std::to_string(TcpLink::kMaxStreams));
  }
  return static_cast<int>(k);
}

std::string tcp_address_blob() {
  return json{{"streams", tcp_streams_per_peer()}}.dump();
}

// Note [stream count agreement]: the data link hellos carry the stream count, but only the
// accepting (lower) rank reads them; the connecting rank only saw its links close and blamed the
// ready barrier ("did not confirm its links"). The count also travels in the peer-info exchange
// (the "tcp" blob), which every rank receives whole before any link is opened, so both ends of a
// pair compare the same two values and fail at once with the same text. The hello check stays
// for a peer whose info has no such blob.
void check_tcp_streams(const ResolvedCluster& c, const std::vector<bootstrap::PeerInfo>& peers,
                       const std::vector<TransportKind>& kinds) {
  const int ours = tcp_streams_per_peer();
  for (const bootstrap::PeerInfo& p : peers) {
    if (p.rank == c.task_id || p.rank < 0 || p.rank >= c.num_workers) continue;
    if (kinds[static_cast<std::size_t>(p.rank)] != TransportKind::kTcp) continue;
    auto blob = p.blobs.find("tcp");
    if (blob == p.blobs.end()) continue;
    json j = json::parse(blob->second, nullptr, false);
    if (!j.is_object() || !j.contains("streams") || !j["streams"].is_number_integer()) continue;
    const long long theirs = j["streams"].get<long long>();
    if (theirs == ours) continue;
    const std::string address = c.ring[static_cast<std::size_t>(p.rank)];
    throw BootstrapError("MWMS_NSOCKS_PERPEER differs between the ends of a TCP pair: " +
                             c.task_name_of_rank(p.rank) + " (rank " + std::to_string(p.rank) +
                             " at " + address + ") has MWMS_NSOCKS_PERPEER=" +
                             std::to_string(theirs) + ", " + c.task_name() + " (rank " +
                             std::to_string(c.task_id) + ", this task) has " +
                             "MWMS_NSOCKS_PERPEER=" + std::to_string(ours) +
                             "; MWMS_NSOCKS_PERPEER must be the same on every rank",
                         mesh_context(c, p.rank));
  }
}

long long socket_buffer_bytes() {
  const long long b = common::env_int("MWMS_SOCKET_BUFFER_BYTES");
  if (b < 0 || b > (1LL << 30)) {
    throw InvalidArgument("MWMS_SOCKET_BUFFER_BYTES=" + std::to_string(b) +
                          " is outside 0 (kernel autotuning) .. 1073741824");
  }
  return b;
}

MeshSockets connect_mesh(const ResolvedCluster& c, const common::Socket& listener,
                         const std::vector<TransportKind>& kinds, double timeout_seconds) {
  const int n = c.num_workers;
  const int streams = tcp_streams_per_peer();
  MeshSockets out;
  out.control.resize(static_cast<std::size_t>(n));
  out.data.resize(static_cast<std::size_t>(n));
  for (int p = 0; p < n; ++p) {
    if (p != c.task_id && kinds[static_cast<std::size_t>(p)] == TransportKind::kTcp) {
      out.data[static_cast<std::size_t>(p)].resize(static_cast<std::size_t>(streams));
    }
  }
  common::Deadline deadline = common::deadline_after(timeout_seconds);
  // Connect to every lower rank first (their listeners queue us), then accept the higher ones.
  for (int p = 0; p < c.task_id; ++p) {
    TransportKind k = kinds[static_cast<std::size_t>(p)];
    out.control[static_cast<std::size_t>(p)] =
        connect_to(c, p, MessageKind::kRingControl, k, deadline, timeout_seconds);
    for (int i = 0; k == TransportKind::kTcp && i < streams; ++i) {
      out.data[static_cast<std::size_t>(p)][static_cast<std::size_t>(i)] =
          connect_to(c, p, MessageKind::kRingData, k, deadline, timeout_seconds, i, streams);
    }
  }
  accept_from_higher(c, listener, kinds, deadline, timeout_seconds, streams, &out);
  for (common::Socket& s : out.control) {
    if (s.valid()) common::tune_stream_socket(s.fd());
  }
  const long long buffer = socket_buffer_bytes();
  for (auto& pair : out.data) {
    for (common::Socket& s : pair) {
      common::tune_stream_socket(s.fd());
      if (buffer > 0) size_socket_buffers(s.fd(), static_cast<int>(buffer));
    }
  }
  MWMS_LOG_DEBUG(kRing, "links connected to " << n - 1 << " peers");
  if (c.is_chief) {
    MWMS_LOG_INFO(kRing, "tcp data links: " << streams << " stream(s) per peer, socket buffers "
                                            << (buffer > 0 ? std::to_string(buffer) + " bytes"
                                                           : std::string("autotuned")));
  }
  return out;
}

TcpTransport::TcpTransport(std::vector<std::vector<common::Socket>> data,
                           std::size_t chunk_bytes)
    : data_(std::move(data)), caps_(tcp_caps(chunk_bytes)) {}

std::vector<std::unique_ptr<Link>> TcpTransport::connect(const std::vector<int>& peers,
                                                         const ConnectContext&) {
  std::vector<std::unique_ptr<Link>> links;
  for (int p : peers) {
    MWMS_CHECK(!data_[static_cast<std::size_t>(p)].empty(),
               "no TCP socket for rank " + std::to_string(p));
    links.push_back(std::make_unique<TcpLink>(p, std::move(data_[static_cast<std::size_t>(p)]),
                                              caps_.chunk_bytes));
  }
  return links;
}

}  // namespace mwms::collective
