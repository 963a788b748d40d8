#include "collective/transport/tcp/tcp_transport.h"

#include <sys/socket.h>

#include <utility>

#include <nlohmann/json.hpp>

#include "collective/transport/tcp/tcp_link.h"
#include "common/env.h"
#include "common/logging.h"
#include "mwms/errors.h"

namespace mwms::collective {

namespace {

using nlohmann::json;

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

std::unique_ptr<Transport> create_tcp(const TransportOptions& options) {
  return std::make_unique<TcpTransport>(options.chunk_bytes);
}

// Every rank has a listener (the rendezvous made it) and so can reach every other: a pair can use
// TCP when both ends offer it.
std::string tcp_cannot_connect(const bootstrap::PeerInfo& me, const bootstrap::PeerInfo& peer) {
  for (const bootstrap::PeerInfo* p : {&me, &peer}) {
    if (p->blobs.count("tcp") == 0) {
      return "rank " + std::to_string(p->rank) + " (" + p->address + ") offers no TCP links";
    }
  }
  return "";
}

void tcp_descriptors(common::DescriptorBudget& budget) { ++budget.tcp_peers; }

}  // namespace

// Its tuning is the selector's defaults: they were measured over TCP (docs/algorithms.md).
const TransportEntry kTcpTransportEntry{"tcp", 10, true, true, create_tcp, tcp_cannot_connect,
                                        tcp_descriptors, LinkTuning{}};

int tcp_streams_per_peer() {
  const long long k = common::env_int("MWMS_NSOCKS_PERPEER");
  if (k < 1 || k > TcpLink::kMaxStreams) {
    throw InvalidArgument("MWMS_NSOCKS_PERPEER=" + std::to_string(k) + " is outside 1.." +
                          std::to_string(TcpLink::kMaxStreams));
  }
  return static_cast<int>(k);
}

long long socket_buffer_bytes() {
  const long long b = common::env_int("MWMS_SOCKET_BUFFER_BYTES");
  if (b < 0 || b > (1LL << 30)) {
    throw InvalidArgument("MWMS_SOCKET_BUFFER_BYTES=" + std::to_string(b) +
                          " is outside 0 (kernel autotuning) .. 1073741824");
  }
  return b;
}

TcpTransport::TcpTransport(std::size_t chunk_bytes)
    : streams_(tcp_streams_per_peer()),
      buffer_bytes_(socket_buffer_bytes()),
      caps_(tcp_caps(chunk_bytes)) {}

std::string TcpTransport::local_address() const { return json{{"streams", streams_}}.dump(); }

// Note [stream count agreement]: the data link hellos carry the stream count, but only the
// accepting (lower) rank reads them; the connecting rank only saw its links close and blamed the
// ready barrier ("did not confirm its links"). The count also travels in the peer-info exchange
// (the "tcp" blob), which every rank receives whole before any link is opened, so both ends of a
// pair compare the same two values and fail at once with the same text. The mesh's hello check
// (socket_mesh.cc) stays as the second line of defence.
void TcpTransport::check_peers(const std::vector<int>& peers, const ConnectContext& ctx) const {
  for (int p : peers) {
    const bootstrap::PeerInfo& info = (*ctx.peers)[static_cast<std::size_t>(p)];
    auto blob = info.blobs.find("tcp");
    if (blob == info.blobs.end()) continue;
    json j = json::parse(blob->second, nullptr, false);
    if (!j.is_object() || !j.contains("streams") || !j["streams"].is_number_integer()) continue;
    const long long theirs = j["streams"].get<long long>();
    if (theirs == streams_) continue;
    ErrorContext ec = ctx.error_context(p);
    ec.transport = "tcp";
    throw BootstrapError("MWMS_NSOCKS_PERPEER differs between the ends of a TCP pair: " +
                             ec.peer_task + " (rank " + std::to_string(p) + " at " +
                             ec.peer_address + ") has MWMS_NSOCKS_PERPEER=" +
                             std::to_string(theirs) + ", " + ec.task + " (rank " +
                             std::to_string(ctx.rank) + ", this task) has " +
                             "MWMS_NSOCKS_PERPEER=" + std::to_string(streams_) +
                             "; MWMS_NSOCKS_PERPEER must be the same on every rank",
                         ec);
  }
}

std::vector<std::unique_ptr<Link>> TcpTransport::connect(const std::vector<int>& peers,
                                                         const ConnectContext& ctx) {
  MWMS_CHECK(ctx.sockets != nullptr, "TCP connect without the mesh's sockets");
  std::vector<std::unique_ptr<Link>> links;
  for (int p : peers) {
    std::vector<common::Socket>& streams = (*ctx.sockets)[static_cast<std::size_t>(p)];
    MWMS_CHECK(static_cast<int>(streams.size()) == streams_,
               "no TCP sockets for rank " + std::to_string(p));
    for (common::Socket& s : streams) {
      common::tune_stream_socket(s.fd());
      if (buffer_bytes_ > 0) size_socket_buffers(s.fd(), static_cast<int>(buffer_bytes_));
    }
    links.push_back(std::make_unique<TcpLink>(p, std::move(streams), caps_.chunk_bytes));
  }
  if (ctx.rank == 0 && !peers.empty()) {
    MWMS_LOG_INFO(kRing, "tcp data links: " << streams_ << " stream(s) per peer, socket buffers "
                                            << (buffer_bytes_ > 0
                                                    ? std::to_string(buffer_bytes_) + " bytes"
                                                    : std::string("autotuned")));
  }
  return links;
}

}  // namespace mwms::collective
