#include "bootstrap/rendezvous.h"

#include <arpa/inet.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <optional>
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

// Note [rendezvous admission]: how the leader decides who joins (docs/security.md).
// - Hellos are read concurrently (HandshakeServer): each connection has kHelloSeconds from its
//   accept to finish its handshake, so N silent connections cost one such deadline, not N.
// - A second claim of a rank never evicts the first: the newcomer is refused. A rank is freed
//   only when its own connection closes before the answer (a restarted task), which a stranger
//   cannot cause.
// - Only a hello that passed the handshake with MWMS_AUTH_KEY (its sender holds the key) can stop
//   the job: a differing cluster, world size or a second claim then fail every task at once, as
//   before. Without a key nothing is proven, so a hello that fails the checks is refused (the
//   sender gets the reason, the leader logs it with the connection's real source address) and
//   the leader keeps waiting; its timeout error repeats the refusals.
// - A connection claiming rank r that fails the key proof is refused; when no task has proven
//   rank r within kMismatchGraceSeconds of it, the job stops with that key mismatch. A real task
//   with another key so fails both ends quickly, while a stranger can never take a rank.
constexpr double kHelloSeconds = 3.0;
constexpr double kMismatchGraceSeconds = 5.0;
// The follower waits for the answer until its connect deadline plus this margin: the leader
// answers (with the ring or with its timeout error) by its own deadline, started about as early.
constexpr double kAnswerMarginSeconds = 2.0;
constexpr std::size_t kMaxRefusalsKept = 8;

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
std::string check_hello(const ResolvedCluster& c, const json& h) {
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

// "worker 1" for a rank of the cluster, "rank 77" for one outside it.
std::string claimed_task(const ResolvedCluster& c, int rank) {
  if (rank >= 0 && rank < c.num_workers) return c.task_name_of_rank(rank);
  return "rank " + std::to_string(rank);
}

// Logs the wait for a rendezvous at info once, then every few seconds at warn (issue 7).
class WaitLog {
 public:
  explicit WaitLog(double timeout) : timeout_(timeout) {}
  template <typename What>
  void tick(const What& what) {
    auto now = common::Clock::now();
    if (now < next_) return;
    double waited = std::chrono::duration<double>(now - start_).count();
    std::ostringstream line;
    line << what() << " (" << static_cast<int>(waited) << " s of " << timeout_ << " s)";
    if (first_) {
      MWMS_LOG_INFO(kBoot, line.str());
    } else {
      MWMS_LOG_WARN(kBoot, line.str());
    }
    first_ = false;
    next_ = now + std::chrono::seconds(5);
  }

 private:
  double timeout_;
  common::Clock::time_point start_ = common::Clock::now();
  common::Clock::time_point next_ = start_ + std::chrono::seconds(1);
  bool first_ = true;
};

// The leader's view of who has joined (Note [rendezvous admission]).
struct Admission {
  std::vector<common::Socket> conns;  // by rank: the connection to answer
  std::vector<std::string> sources;   // by rank: its real source address
  std::vector<bool> seen;
  int arrived = 1;
  std::vector<std::string> refusals;  // the first kMaxRefusalsKept, for the timeout error
  std::map<int, std::pair<common::Clock::time_point, std::string>> mismatches;  // by rank
  std::string fatal;                  // the error that stops the job

  void refused(const std::string& text) {
    MWMS_LOG_WARN(kBoot, "rendezvous: refused " << text);
    if (refusals.size() < kMaxRefusalsKept) refusals.push_back(text);
  }
};

// Frees the rank of a task whose connection closed before the answer (it restarted, or died).
void drop_departed(const ResolvedCluster& c, Admission* a) {
  for (int r = 1; r < c.num_workers; ++r) {
    if (!a->seen[r] || !peer_closed(a->conns[r])) continue;
    MWMS_LOG_WARN(kBoot, "rendezvous: " << c.task_name_of_rank(r) << " (from " << a->sources[r]
                                        << ") closed its connection before the answer; waiting "
                                           "for it again");
    a->seen[r] = false;
    a->conns[r].close();
    --a->arrived;
  }
}

// Takes one connection that finished its handshake: admits it, or refuses it with the reason.
void admit(ResolvedCluster* c, HandshakeEvent ev, bool authenticated, Admission* a,
           std::vector<PeerInfo>* peers) {
  const int rank = ev.claim.rank;
  const std::string from = "a connection from " + ev.source + " claiming " + claimed_task(*c, rank);
  json h = json::parse(ev.claim.hello, nullptr, false);
  std::string error;
  PeerInfo info;
  if (!valid_hello(h) || h["rank"].get<int>() != rank) {
    error = "sent a malformed rendezvous hello";
  } else if (rank > 0 && rank < c->num_workers && a->seen[rank]) {
    error = "two processes claim to be " + c->task_name_of_rank(rank) + ": it joined from " +
            a->sources[rank] + " and " + ev.source + " claims it too; each task must run once";
  } else if (error = check_hello(*c, h); error.empty()) {
    std::string why;
    if (!from_json(h["peer"], &info, &why) || info.rank != rank) {
      error = c->task_name_of_rank(rank) + " sent a malformed peer info: " +
              (why.empty() ? "rank differs from the hello" : why);
    }
  }
  if (!error.empty()) {
    std::string text = error + " (" + from + ")";
    send_message(ev.socket.fd(), MessageKind::kReply, json{{"ok", false}, {"error", text}}.dump(),
                 common::deadline_after(1));
    if (authenticated) {
      a->fatal = text;  // its sender holds the key: a real task of this job is misconfigured
    } else {
      a->refused(from + ": " + error);
    }
    return;
  }
  if (c->source == ClusterSource::kTorchrun) c->ring[rank] = h["address"].get<std::string>();
  (*peers)[rank] = std::move(info);
  a->seen[rank] = true;
  a->conns[rank] = std::move(ev.socket);
  a->sources[rank] = ev.source;
  a->mismatches.erase(rank);
  ++a->arrived;
  MWMS_LOG_DEBUG(kBoot, "rendezvous: " << c->task_name_of_rank(rank) << " arrived from "
                                       << ev.source);
}

// Leader side: collect a hello from every other rank, then answer all of them at once.
void serve_hellos(ResolvedCluster* c, const common::Socket& listener, Deadline deadline,
                  double timeout, std::vector<PeerInfo>* peers) {
  const int n = c->num_workers;
  const AuthKey& key = auth_key_from_env();
  HandshakeServer server(listener, key, {MessageKind::kHello}, kHelloSeconds);
  Admission a;
  a.conns.resize(n);
  a.sources.resize(n);
  a.seen.assign(n, false);
  WaitLog wait_log(timeout);
  auto missing = [&](const char* between) {
    std::string list;
    for (int r = 1; r < n; ++r) {
      if (a.seen[r]) continue;
      std::string where = c->ring[r].empty() ? std::string("address not announced") : c->ring[r];
      list += (list.empty() ? "" : ", ") + c->task_name_of_rank(r) + between + where;
    }
    return list;
  };
  while (a.arrived < n && a.fatal.empty() && common::Clock::now() < deadline) {
    std::optional<HandshakeEvent> ev =
        server.next(std::min(deadline, common::deadline_after(0.5)));
    drop_departed(*c, &a);
    if (ev && ev->ok) {
      admit(c, std::move(*ev), key.enabled(), &a, peers);
    } else if (ev) {
      const int r = ev->claim.rank;
      std::string text = "a connection from " + ev->source +
                         (r >= 0 ? " claiming " + claimed_task(*c, r) : std::string()) + ": " +
                         ev->reason;
      a.refused(text);
      if (ev->key_mismatch && r > 0 && r < n && !a.seen[r] && !a.mismatches.count(r)) {
        a.mismatches[r] = {common::Clock::now(), text};
      }
    }
    for (const auto& [r, m] : a.mismatches) {
      if (a.seen[r] || common::seconds_left(m.first + std::chrono::duration_cast<common::Clock::duration>(
                                                            std::chrono::duration<double>(
                                                                kMismatchGraceSeconds))) > 0) {
        continue;
      }
      a.fatal = c->task_name() + " refused " + m.second + ", and no task proved the key for " +
                c->task_name_of_rank(r) + " within " + fmt_seconds(kMismatchGraceSeconds) +
                "; every task must have the same MWMS_AUTH_KEY (or MWMS_AUTH_KEY_FILE)";
      break;
    }
    wait_log.tick([&] { return "rendezvous: waiting for " + missing(" at "); });
  }
  std::string error = a.fatal;
  if (error.empty() && a.arrived < n) {
    error = c->task_name() + " (" + c->ring[0] + ") waited " + fmt_seconds(timeout) +
            " for every task to join the rendezvous; never arrived: ";
    bool first = true;
    for (int r = 1; r < n; ++r) {
      if (a.seen[r]) continue;
      std::string where = c->ring[r].empty() ? std::string("address not announced") : c->ring[r];
      error += (first ? "" : ", ") + c->task_name_of_rank(r) + " (" + where + ")";
      first = false;
    }
    for (std::size_t i = 0; i < a.refusals.size(); ++i) {
      error += (i == 0 ? "; refused: " : "; ") + a.refusals[i];
    }
  }
  json all = json::array();
  for (const PeerInfo& p : *peers) all.push_back(to_json(p));
  json reply = error.empty() ? json{{"ok", true}, {"ring", c->ring}, {"peers", all}}
                             : json{{"ok", false}, {"error", error}};
  for (int r = 1; r < n; ++r) {
    if (a.conns[r].valid()) {
      send_message(a.conns[r].fd(), MessageKind::kReply, reply.dump(), common::deadline_after(5));
    }
  }
  if (!error.empty()) throw BootstrapError(error, context_of(*c));
}

// Raises the follower's error for a handshake with the leader that did not succeed.
[[noreturn]] void throw_handshake(const ResolvedCluster& c, const ConnectOutcome& o) {
  using Status = ConnectOutcome::Status;
  std::string leader = c.task_name_of_rank(0) + " at " + c.ring[0];
  std::string text;
  switch (o.status) {
    case Status::kKeyMismatch:
      text = "key mismatch: " + c.task_name() + " and " + leader +
             " do not hold the same MWMS_AUTH_KEY (" + o.detail +
             "); every task must have the same key";
      break;
    case Status::kRefused:
      text = leader + " refused the connection of " + c.task_name() + ": " + o.detail;
      break;
    case Status::kIo:
      text = c.task_name() + " could not finish the handshake with " + leader + ": " +
             o.io.describe() + " (is a libmwms task listening there?)";
      break;
    default:
      text = c.task_name() + " could not finish the handshake with " + leader + ": " + o.detail +
             " (is another program, or another libmwms version, holding that port?)";
  }
  throw BootstrapError(text, context_of(c, 0));
}

// Follower side: reach the leader, introduce ourselves, receive the ring or the job's error.
void join_leader(ResolvedCluster* c, Deadline deadline, double timeout, const PeerInfo& mine,
                 std::vector<PeerInfo>* peers) {
  auto [host, port] = split_address(c->ring[0]);
  const AuthKey& key = auth_key_from_env();
  std::string last_error;
  auto start = common::Clock::now();
  WaitLog wait_log(timeout);
  const std::string leader = c->task_name_of_rank(0) + " at " + c->ring[0];
  common::Socket s;
  while (!s.valid() && common::Clock::now() < deadline) {
    s = common::connect_tcp(host, port, std::min(deadline, common::deadline_after(1)),
                            &last_error);
    if (!s.valid()) wait_log.tick([&] { return "rendezvous: waiting for " + leader; });
  }
  if (!s.valid()) {
    throw BootstrapError(c->task_name() + " could not reach " + leader + " for " +
                             fmt_seconds(timeout) + " (last error: " + last_error +
                             "); is that task running with the same cluster?",
                         context_of(*c, 0));
  }
  // The leader answers once every rank has arrived, by its own deadline (Note [rendezvous
  // admission]); honour the connect timeout within a small margin.
  const Deadline answer_deadline =
      deadline + std::chrono::duration_cast<common::Clock::duration>(
                     std::chrono::duration<double>(kAnswerMarginSeconds));
  HandshakeClaim claim{MessageKind::kHello, c->task_id, c->cluster.fingerprint(),
                       hello_of(*c, mine).dump()};
  ConnectOutcome o = connect_handshake(s.fd(), key, claim, answer_deadline);
  if (o.status != ConnectOutcome::Status::kOk) throw_handshake(*c, o);
  MessageKind kind;
  std::string text;
  IoResult r{IoStatus::kTimeout, 0};
  while (common::Clock::now() < answer_deadline) {
    pollfd p{s.fd(), POLLIN, 0};
    if (::poll(&p, 1, 1000) > 0) {
      r = recv_message(s.fd(), &kind, &text, answer_deadline);
      break;
    }
    wait_log.tick([&] { return "rendezvous: waiting for the answer of " + leader; });
  }
  if (r.status != IoStatus::kOk) {
    double waited = std::chrono::duration<double>(common::Clock::now() - start).count();
    throw BootstrapError(c->task_name() + " got no rendezvous answer from " + leader + " after " +
                             fmt_seconds(waited) + " of " + fmt_seconds(timeout) +
                             " (MWMS_CONNECT_TIMEOUT_SECONDS, + " +
                             fmt_seconds(kAnswerMarginSeconds) + " margin): " + r.describe() +
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
  auth_key_from_env();  // a bad MWMS_AUTH_KEY(_FILE) fails here, before anything listens
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
