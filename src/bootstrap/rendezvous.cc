#include "bootstrap/rendezvous.h"

#include <arpa/inet.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "bootstrap/local_address.h"
#include "common/env.h"
#include "common/logging.h"
#include "mwms/errors.h"

// Note [torchrun rendezvous]: torchrun names only rank 0's address (MASTER_ADDR:MASTER_PORT), as
// mpirun names none. Rank 0 listens there (on every interface); every other rank listens on an
// ephemeral port and announces host:port in its hello (the host chosen as Note [advertised
// address] says); the leader checks each announced address, fills ring[rank] with it and answers
// every rank with the full ring and peer infos, exactly as for a TF_CONFIG job. There is no
// cluster spec to compare, so the fingerprint check is reduced to the world size and ranks (like
// MPI jobs). With torchrun's static rendezvous the agent serves its own store at MASTER_PORT
// (TORCHELASTIC_USE_AGENT_STORE=True): launchers.cc then gives rank 0 the port after it.
namespace mwms::bootstrap {

namespace {

using common::Deadline;
using common::IoResult;
using common::IoStatus;
using nlohmann::json;

constexpr std::uint32_t kMagic = 0x424D574D;  // "MWMB" little-endian
constexpr std::uint32_t kVersion = 1;

struct MessageHeader {
  std::uint32_t magic;
  std::uint32_t version;
  std::uint32_t kind;
  std::uint32_t length;
};

std::string fmt_seconds(double s) {
  std::ostringstream out;
  out.precision(1);
  out << std::fixed << s << " s";
  return out.str();
}

ErrorContext context_of(const ResolvedCluster& c, int peer = -1) {
  ErrorContext ctx;
  ctx.rank = c.task_id;
  ctx.world_size = c.num_workers;
  ctx.task = c.task_name();
  ctx.op = "rendezvous";
  if (peer >= 0) {
    ctx.peer_rank = peer;
    ctx.peer_task = c.task_name_of_rank(peer);
    if (peer < static_cast<int>(c.ring.size())) ctx.peer_address = c.ring[peer];
  }
  return ctx;
}

std::string local_hostname() {
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  return host;
}

// Sources whose addresses are exchanged at start-up rather than listed in a spec: every rank's
// view of "the cluster" is then empty, and the leader learns the followers' addresses.
bool addresses_exchanged(const ResolvedCluster& c) {
  return c.source == ClusterSource::kMpi || c.source == ClusterSource::kTorchrun;
}

// MPI jobs have no addresses in a spec: listen on a free port and exchange "host:port" through
// MPI. When every rank runs on one host, loopback is used (hostnames may not resolve here).
void fill_ring_through_mpi(ResolvedCluster* c, const common::Socket& listener) {
  // Note [advertised address]: MWMS_SOCKET_IFNAME picks the interface; else the host name.
  std::string host = common::env_is_set("MWMS_SOCKET_IFNAME")
                         ? bracket_host(advertised_host("", 0))
                         : local_hostname();
  std::string mine = host + ":" + std::to_string(common::local_port(listener));
  std::vector<std::string> all = mpi_allgather_strings(mine);
  if (static_cast<int>(all.size()) != c->num_workers) {
    throw BootstrapError("MPI world size " + std::to_string(all.size()) +
                         " differs from OMPI_COMM_WORLD_SIZE " + std::to_string(c->num_workers),
                         context_of(*c));
  }
  // Rank/size confirmed from MPI itself: the launcher's variables may describe another world.
  const std::string me = all.size() > static_cast<std::size_t>(c->task_id) ? all[c->task_id] : "";
  if (me != mine) {
    throw BootstrapError("MPI_COMM_WORLD gives this process another rank than " +
                             c->source_detail + " (" + std::to_string(c->task_id) +
                             "): the launcher's variables do not describe this MPI world",
                         context_of(*c));
  }
  bool one_host = !common::env_is_set("MWMS_SOCKET_IFNAME");
  for (const auto& e : all) one_host = one_host && e.substr(0, e.rfind(':')) == host;
  if (!one_host && common::env_is_set("MWMS_SOCKET_IFNAME")) {
    c->ring = all;
    return;
  }
  c->ring.clear();
  for (const auto& e : all) c->ring.push_back(one_host ? "127.0.0.1" + e.substr(e.rfind(':')) : e);
}

common::Socket open_listener(ResolvedCluster* c) {
  int port = 0;
  if (c->source == ClusterSource::kTorchrun) {
    if (c->task_id == 0) port = split_address(c->ring[0]).second;  // Note [torchrun rendezvous]
  } else if (c->source != ClusterSource::kMpi) {
    port = split_address(c->ring[c->task_id]).second;
  }
  int error = 0;
  common::Socket listener = common::listen_tcp(port, &error);
  if (!listener.valid()) {
    std::string why = std::strerror(error);
    if (error == EADDRINUSE) {
      why = "address already in use: another process (an older run of this job?) holds port " +
            std::to_string(port);
    }
    std::string address = c->ring.empty() ? std::string("an ephemeral port") : c->ring[c->task_id];
    throw BootstrapError(c->task_name() + " cannot listen on port " + std::to_string(port) +
                             " (its address " + address + " from " +
                             c->source_detail + "): " + why,
                         context_of(*c));
  }
  if (c->source == ClusterSource::kMpi) fill_ring_through_mpi(c, listener);
  if (c->source == ClusterSource::kTorchrun) {
    // Rank 0 listens at the master address; the others announce where they listen in their hello
    // and the leader answers with every address (Note [torchrun rendezvous]).
    std::string master = c->ring.at(0);
    c->ring.assign(static_cast<std::size_t>(c->num_workers), std::string());
    c->ring[0] = master;
    if (c->task_id != 0) {
      auto [host, master_port] = split_address(master);
      c->ring[c->task_id] = bracket_host(advertised_host(host, master_port)) + ":" +
                            std::to_string(common::local_port(listener));
    }
  }
  return listener;
}

json hello_of(const ResolvedCluster& c, const PeerInfo& mine) {
  return json{{"rank", c.task_id},
              {"peer", to_json(mine)},
              {"world_size", c.num_workers},
              {"task", c.task_name()},
              {"address", c.ring[c.task_id]},
              {"cluster", addresses_exchanged(c) ? std::string() : c.cluster.canonical_json()},
              {"host", local_hostname()},
              {"pid", static_cast<int>(::getpid())}};
}

constexpr double kHelloSeconds = 3.0;

// A hello has the fields and types check_hello reads (anything else came from a foreign client).
bool valid_hello(const json& h) {
  return h.is_object() && h.contains("rank") && h["rank"].is_number_integer() &&
         h.contains("world_size") && h["world_size"].is_number_integer() && h.contains("task") &&
         h["task"].is_string() && h.contains("address") && h["address"].is_string() &&
         h.contains("cluster") && h["cluster"].is_string() && h.contains("peer");
}

// True when the peer of a connection has closed it (or it was never open).
bool peer_closed(const common::Socket& s) {
  if (!s.valid()) return true;
  char byte;
  ssize_t n = ::recv(s.fd(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

// Checks one hello against the leader's own view; returns an error text or "".
std::string check_hello(const ResolvedCluster& c, const json& h, const std::vector<bool>& seen) {
  int rank = h.value("rank", -1);
  int world = h.value("world_size", -1);
  std::string task = h.value("task", std::string("?"));
  std::string address = h.value("address", std::string("?"));
  std::string who = task + " (" + address + ", rank " + std::to_string(rank) + ")";
  std::string theirs = h.value("cluster", std::string());
  std::string ours = addresses_exchanged(c) ? std::string() : c.cluster.canonical_json();
  if (theirs != ours) {
    return "cluster specs differ: " + who + " holds " + theirs + " but " + c.task_name() + " (" +
           c.ring[0] + ") holds " + ours + "; every task must be started with the same cluster";
  }
  if (world != c.num_workers) {
    return who + " counts " + std::to_string(world) + " workers but " + c.task_name() +
           " counts " + std::to_string(c.num_workers);
  }
  if (rank <= 0 || rank >= c.num_workers) {
    return who + " claims rank " + std::to_string(rank) + ", outside [1, " +
           std::to_string(c.num_workers) + ")";
  }
  if (seen[rank]) return "two processes claim to be " + who + "; each task must run once";
  if (c.source == ClusterSource::kTorchrun) {
    try {
      if (address.size() > 300) throw BootstrapError("longer than 300 bytes");
      split_address(address, "announced address");
    } catch (const BootstrapError& e) {
      return who + " announced an address that is not host:port: " + e.what();
    }
  }
  return "";
}

// Leader side: collect a hello from every other rank, then answer all of them at once.
void serve_hellos(ResolvedCluster* c, const common::Socket& listener, Deadline deadline,
                  double timeout, std::vector<PeerInfo>* peers) {
  int n = c->num_workers;
  std::vector<common::Socket> conns(n);
  std::vector<bool> seen(n, false);
  std::string error;
  int arrived = 1;
  while (arrived < n && error.empty()) {
    IoResult r;
    common::Socket s = common::accept_until(listener, deadline, &r);
    if (!s.valid()) break;  // deadline passed: reported below with the missing ranks
    MessageKind kind;
    std::string text;
    // A libmwms task sends its hello right after connecting; a silent or foreign client must not
    // hold up the others for long.
    IoResult m = recv_message(s.fd(), &kind, &text,
                              std::min(deadline, common::deadline_after(kHelloSeconds)));
    json h = m.status == IoStatus::kOk ? json::parse(text, nullptr, false) : json();
    if (m.status != IoStatus::kOk || kind != MessageKind::kHello || !valid_hello(h)) {
      MWMS_LOG_WARN(kBoot, "ignoring a connection that sent no valid libmwms hello ("
                               << m.describe() << ")");
      continue;
    }
    int rank = h["rank"].get<int>();
    if (rank > 0 && rank < n && seen[rank] && peer_closed(conns[rank])) {
      // The task restarted (e.g. its pod was rescheduled) after its first hello: take the new one.
      MWMS_LOG_WARN(kBoot, "rendezvous: " << c->task_name_of_rank(rank) << " reconnected");
      seen[rank] = false;
      --arrived;
    }
    error = check_hello(*c, h, seen);
    PeerInfo info;
    std::string why;
    if (error.empty() && (!from_json(h["peer"], &info, &why) || info.rank != rank)) {
      error = c->task_name_of_rank(rank) + " sent a malformed peer info: " +
              (why.empty() ? "rank differs from the hello" : why);
    }
    if (error.empty()) {
      if (c->source == ClusterSource::kTorchrun) c->ring[rank] = h["address"].get<std::string>();
      (*peers)[rank] = std::move(info);
      seen[rank] = true;
      conns[rank] = std::move(s);
      ++arrived;
      MWMS_LOG_DEBUG(kBoot, "rendezvous: " << h["task"].get<std::string>() << " arrived");
    } else {
      send_message(s.fd(), MessageKind::kReply, json{{"ok", false}, {"error", error}}.dump(),
                   common::deadline_after(5));
    }
  }
  if (error.empty() && arrived < n) {
    std::string missing;
    for (int r = 1; r < n; ++r) {
      if (seen[r]) continue;
      std::string where = c->ring[r].empty() ? std::string("address not announced") : c->ring[r];
      missing += (missing.empty() ? "" : ", ") + c->task_name_of_rank(r) + " (" + where + ")";
    }
    error = c->task_name() + " (" + c->ring[0] + ") waited " + fmt_seconds(timeout) +
            " for every task to join the rendezvous; never arrived: " + missing;
  }
  json all = json::array();
  for (const PeerInfo& p : *peers) all.push_back(to_json(p));
  json reply = error.empty() ? json{{"ok", true}, {"ring", c->ring}, {"peers", all}}
                             : json{{"ok", false}, {"error", error}};
  for (int r = 1; r < n; ++r) {
    if (conns[r].valid()) send_message(conns[r].fd(), MessageKind::kReply, reply.dump(), common::deadline_after(5));
  }
  if (!error.empty()) throw BootstrapError(error, context_of(*c));
}

// Follower side: reach the leader, introduce ourselves, receive the ring or the job's error.
void join_leader(ResolvedCluster* c, Deadline deadline, double timeout, const PeerInfo& mine,
                 std::vector<PeerInfo>* peers) {
  auto [host, port] = split_address(c->ring[0]);
  std::string last_error;
  auto start = common::Clock::now();
  common::Socket s = common::connect_tcp(host, port, deadline, &last_error);
  if (!s.valid()) {
    throw BootstrapError(c->task_name() + " could not reach " + c->task_name_of_rank(0) + " at " +
                             c->ring[0] + " for " + fmt_seconds(timeout) + " (last error: " +
                             last_error + "); is that task running with the same cluster?",
                         context_of(*c, 0));
  }
  IoResult w = send_message(s.fd(), MessageKind::kHello, hello_of(*c, mine).dump(), deadline);
  MessageKind kind;
  std::string text;
  // The leader answers once every rank has arrived, which can take up to its own timeout.
  IoResult r = w.status == IoStatus::kOk
                   ? recv_message(s.fd(), &kind, &text, common::deadline_after(timeout + 10))
                   : w;
  if (r.status != IoStatus::kOk) {
    double waited = std::chrono::duration<double>(common::Clock::now() - start).count();
    throw BootstrapError(c->task_name() + " got no rendezvous answer from " +
                             c->task_name_of_rank(0) + " at " + c->ring[0] + " after " +
                             fmt_seconds(waited) + ": " + r.describe() +
                             " (is a libmwms task listening there, or another program holding "
                             "that port?)",
                         context_of(*c, 0));
  }
  json reply = kind == MessageKind::kReply ? json::parse(text, nullptr, false) : json();
  bool ok = reply.is_object() && reply.contains("ok") && reply["ok"].is_boolean();
  if (ok && !reply["ok"].get<bool>()) {
    std::string why = reply.contains("error") && reply["error"].is_string()
                          ? reply["error"].get<std::string>()
                          : std::string("no reason given");
    throw BootstrapError("rendezvous failed: " + why, context_of(*c, 0));
  }
  std::vector<std::string> ring;
  try {
    if (ok) ring = reply.at("ring").get<std::vector<std::string>>();
    const json& all = reply.at("peers");
    if (!all.is_array() || static_cast<int>(all.size()) != c->num_workers) ring.clear();
    for (std::size_t r = 0; r < ring.size(); ++r) {
      std::string why;
      if (!from_json(all[r], &(*peers)[r], &why) || (*peers)[r].rank != static_cast<int>(r)) {
        ring.clear();
      }
    }
  } catch (const json::exception&) {
    ring.clear();
  }
  if (static_cast<int>(ring.size()) != c->num_workers) {
    throw BootstrapError(c->task_name() + " got a malformed rendezvous answer from " +
                             c->ring[0] + " (is another program holding that port?)",
                         context_of(*c, 0));
  }
  c->ring = std::move(ring);
}

void log_ring(const ResolvedCluster& c) {
  if (!c.is_chief) return;
  MWMS_LOG_INFO(kBoot, "cluster from " << c.source_detail << ", world size " << c.num_workers
                                       << ", fingerprint " << c.cluster.fingerprint());
  for (int r = 0; r < static_cast<int>(c.ring.size()); ++r) {
    MWMS_LOG_INFO(kBoot, "ring position " << r << " task " << c.task_name_of_rank(r)
                                          << " address " << c.ring[r]);
  }
}

}  // namespace

IoResult send_message(int fd, MessageKind kind, const std::string& text, Deadline deadline) {
  // Refuse here what the receiver would refuse as a protocol error: the sender then reports the
  // true cause ("Message too long") instead of the peer seeing a broken frame. TF_CONFIG's limits
  // (Note [bounded TF_CONFIG]) keep real rendezvous messages far below kMaxMessageBytes.
  if (text.size() > kMaxMessageBytes) return {IoStatus::kError, EMSGSIZE};
  MessageHeader h{kMagic, kVersion, static_cast<std::uint32_t>(kind),
                  static_cast<std::uint32_t>(text.size())};
  IoResult r = common::write_exact(fd, &h, sizeof(h), deadline);
  if (r.status != IoStatus::kOk) return r;
  return common::write_exact(fd, text.data(), text.size(), deadline);
}

IoResult recv_message(int fd, MessageKind* kind, std::string* text, Deadline deadline) {
  MessageHeader h{};
  IoResult r = common::read_exact(fd, &h, sizeof(h), deadline);
  if (r.status != IoStatus::kOk) return r;
  if (h.magic != kMagic || h.version != kVersion || h.length > kMaxMessageBytes) {
    return {IoStatus::kError, EPROTO};
  }
  *kind = static_cast<MessageKind>(h.kind);
  text->assign(h.length, '\0');
  return common::read_exact(fd, text->data(), h.length, deadline);
}

RendezvousResult rendezvous(const ResolvedCluster& in, double connect_timeout_seconds,
                            PeerInfo mine) {
  RendezvousResult out{in, common::Socket(), {}};
  ResolvedCluster& c = out.cluster;
  common::set_log_rank(c.task_id, c.num_workers);
  mine.rank = c.task_id;
  if (mine.host_id.empty()) mine.host_id = local_host_id();
  if (mine.transport.empty()) mine.transport = "auto";
  if (c.num_workers <= 1 || !c.in_ring) {
    if (!c.ring.empty()) mine.address = c.ring[0];
    out.peers.push_back(mine);
    assign_local_ranks(&out.peers);
    log_ring(c);
    return out;
  }
  Deadline deadline = common::deadline_after(connect_timeout_seconds);
  out.listener = open_listener(&c);
  mine.address = c.ring[c.task_id];
  out.peers.resize(static_cast<std::size_t>(c.num_workers));
  if (c.task_id == 0) {
    out.peers[0] = mine;
    serve_hellos(&c, out.listener, deadline, connect_timeout_seconds, &out.peers);
  } else {
    join_leader(&c, deadline, connect_timeout_seconds, mine, &out.peers);
  }
  assign_local_ranks(&out.peers);
  log_ring(c);
  return out;
}

}  // namespace mwms::bootstrap
