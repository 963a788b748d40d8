#include "bootstrap/rendezvous.h"

#include <arpa/inet.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <thread>
#include <tuple>
#include <vector>

#include "bootstrap/error_context.h"
#include "bootstrap/local_address.h"
#include "bootstrap/rendezvous_internal.h"
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
using detail::addresses_exchanged;
using detail::context_of;
using detail::fmt_seconds;
using detail::WaitLog;
using nlohmann::json;

std::string local_hostname() {
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  return host;
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

// Note [inherited listener]: a launcher that picks a free port, writes it into TF_CONFIG and
// lets the task bind it cannot hold the port in between: another process can bind it first (the
// task then fails with "address already in use", or its peers reach a stranger). mwmsrun
// therefore binds and listens on every task's port itself and hands the task that listening
// socket as an inherited descriptor, named by MWMS_LISTEN_FD; the rendezvous adopts it instead
// of binding, after checking that it is a listening TCP socket on the port of the task's own
// address (any port where the launcher names none: MPI, torchrun ranks > 0) and at an address
// that the address's host reaches (common::listener_problem). It is adopted once per process:
// it then becomes close-on-exec (processes the task starts, from any thread, do not inherit it)
// and belongs to the rendezvous' listener, closed once the links are set up like a bound one;
// a later rendezvous in the same process (a communicator rebuilt after a failure) binds the
// port itself, as without the variable, since the number may by then name another descriptor. The variable stays in the environment
// (changing it is not thread-safe): a child process that is a task of its own job gets a clear
// error, not a foreign socket. mwmsrun closes its own copy after the fork (a copy kept open
// would accept connections for a task that has died); it restarts no task.
std::atomic<bool> g_listen_fd_adopted{false};

// The listener inherited through MWMS_LISTEN_FD for a task that would listen at `port` (0: any)
// of `host`, or an invalid Socket without the variable or after the first adoption.
common::Socket inherited_listener(const ResolvedCluster& c, int port, const std::string& host) {
  if (!common::env_is_set("MWMS_LISTEN_FD")) return common::Socket();
  const std::string value = common::env_string("MWMS_LISTEN_FD");
  if (g_listen_fd_adopted.exchange(true)) {
    MWMS_LOG_DEBUG(kBoot, "MWMS_LISTEN_FD=" << value << " was adopted by an earlier rendezvous "
                          "of this process; binding port " << port << " instead");
    return common::Socket();
  }
  const bool digits = !value.empty() && value.size() <= 9 &&
                      value.find_first_not_of("0123456789") == std::string::npos;
  if (!digits) {
    throw InvalidArgument("MWMS_LISTEN_FD=" + value + " is not a descriptor number (a whole "
                          "number >= 0: the listening socket a launcher such as mwmsrun "
                          "passes to " + c.task_name() + ")");
  }
  const int fd = std::stoi(value);
  const std::string problem = common::listener_problem(fd, port, host);
  if (!problem.empty()) {
    const std::string address =
        port == 0 || c.task_id >= static_cast<int>(c.ring.size())
            ? std::string("its launcher names no port")
            : "address " + c.ring[c.task_id] + " from " + c.source_detail;
    throw BootstrapError("MWMS_LISTEN_FD=" + value + " cannot be the listener of " +
                             c.task_name() + " (" + address + "): " + problem,
                         context_of(c));
  }
  common::Socket listener = common::adopt_listener(fd);
  MWMS_LOG_DEBUG(kBoot, "listening on the socket inherited as MWMS_LISTEN_FD=" << fd << " (port "
                        << common::local_port(listener) << ")");
  return listener;
}

common::Socket open_listener(ResolvedCluster* c) {
  int port = 0;
  std::string host;
  if (c->source == ClusterSource::kTorchrun) {
    if (c->task_id == 0) {
      std::tie(host, port) = split_address(c->ring[0]);  // Note [torchrun rendezvous]
    }
  } else if (c->source != ClusterSource::kMpi) {
    std::tie(host, port) = split_address(c->ring[c->task_id]);
  }
  int error = 0;
  common::Socket listener = inherited_listener(*c, port, host);
  if (!listener.valid()) listener = common::listen_tcp(port, &error);
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

// The follower waits for the answer until its connect deadline plus this margin: the leader
// answers (with the ring or with its timeout error) by its own deadline, started about as early.
constexpr double kAnswerMarginSeconds = 2.0;

// Raises the follower's error for a handshake with the leader that did not succeed.
[[noreturn]] void throw_handshake(const ResolvedCluster& c, const ConnectOutcome& o) {
  using Status = ConnectOutcome::Status;
  std::string leader = c.task_name_of_rank(0) + " at " + c.ring[0];
  std::string text;
  switch (o.status) {
    case Status::kKeyMismatch:
      text = "key mismatch: " + c.task_name() + " and " + leader +
             " do not hold the same MWMS_AUTH_KEY (" + mismatch_detail(o) +
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

// A connection to the leader, retried until `deadline`; invalid when it never answered.
common::Socket reach_leader(const ResolvedCluster& c, Deadline deadline, WaitLog* wait_log,
                            std::string* last_error) {
  auto [host, port] = split_address(c.ring[0]);
  const std::string leader = c.task_name_of_rank(0) + " at " + c.ring[0];
  common::Socket s;
  while (!s.valid() && common::Clock::now() < deadline) {
    bool exhausted = false;
    s = common::connect_tcp(host, port, std::min(deadline, common::deadline_after(1)),
                            last_error, &exhausted);
    if (exhausted) {  // Note [descriptor budget]
      throw BootstrapError(c.task_name() + " could not connect to " + leader + ": " + *last_error,
                           context_of(c, 0));
    }
    if (!s.valid()) wait_log->tick([&] { return "rendezvous: waiting for " + leader; });
  }
  return s;
}

// Note [listen failure reported]: a follower that cannot listen on its own address (the port
// taken by another process, an unusable MWMS_LISTEN_FD) fails at once, but its peers would learn
// of it only when the leader's connect timeout (60 s) named a task that "never arrived". So it
// first logs its error, then sends the leader a hello carrying it ("listen_error"), and raises
// its own error once the leader has answered or the connect deadline passed. The leader admits
// that hello under the same rules as any (Note [rendezvous admission]: the same cluster, world
// size and an unclaimed rank, and the key when there is one) and then stops the job at once,
// answering every task with the reported cause: a stranger able to send such a hello could as
// well take the rank and fail the job, so this gives no new power. A leader that cannot listen
// has no one to tell: its followers report it unreachable at their deadline.
void tell_leader_cannot_listen(const ResolvedCluster& c, Deadline deadline, double timeout,
                               PeerInfo mine, const std::string& error) {
  const std::string leader = c.task_name_of_rank(0) + " at " + c.ring[0];
  MWMS_LOG_ERROR(kBoot, error << "; telling " << leader << " so that every task stops");
  try {
    WaitLog wait_log(timeout);
    std::string last_error;
    common::Socket s = reach_leader(c, deadline, &wait_log, &last_error);
    if (!s.valid()) return;
    mine.address = c.ring[c.task_id];
    json hello = hello_of(c, mine);
    hello["listen_error"] = error;
    HandshakeClaim claim{MessageKind::kHello, c.task_id, c.cluster.fingerprint(), hello.dump()};
    const Deadline answer = common::deadline_after(5);  // the leader answers it at once
    if (connect_handshake(s.fd(), auth_key_from_env(), claim, answer).status !=
        ConnectOutcome::Status::kOk) {
      return;
    }
    MessageKind kind;
    std::string text;
    recv_message(s.fd(), &kind, &text, answer);  // the leader's answer: the job stops
  } catch (const Error& e) {
    MWMS_LOG_DEBUG(kBoot, "could not tell " << leader << ": " << e.what());
  }
}

// Follower side: reach the leader, introduce ourselves, receive the ring or the job's error.
void join_leader(ResolvedCluster* c, Deadline deadline, double timeout, const PeerInfo& mine,
                 std::vector<PeerInfo>* peers) {
  const AuthKey& key = auth_key_from_env();
  std::string last_error;
  auto start = common::Clock::now();
  WaitLog wait_log(timeout);
  const std::string leader = c->task_name_of_rank(0) + " at " + c->ring[0];
  // The leader answers once every rank has arrived, by its own deadline (Note [rendezvous
  // admission]); honour the connect timeout within a small margin.
  const Deadline answer_deadline =
      deadline + std::chrono::duration_cast<common::Clock::duration>(
                     std::chrono::duration<double>(kAnswerMarginSeconds));
  HandshakeClaim claim{MessageKind::kHello, c->task_id, c->cluster.fingerprint(),
                       hello_of(*c, mine).dump()};
  common::Socket s;
  for (;;) {
    s = reach_leader(*c, deadline, &wait_log, &last_error);
    if (!s.valid()) {
      throw BootstrapTimeoutError(c->task_name() + " could not reach " + leader + " for " +
                                      fmt_seconds(timeout) + " (last error: " + last_error +
                                      "); is that task running with the same cluster?",
                                  context_of(*c, 0));
    }
    ConnectOutcome o = connect_handshake(s.fd(), key, claim, answer_deadline);
    if (o.status == ConnectOutcome::Status::kOk) break;
    // Note [leader not listening yet]: the leader's port may still belong to the previous
    // communicator of that task (one program creating communicators one after another, a
    // session reconnecting after a failure): its start-up listener closes with our connection
    // queued (a reset), or its link phase refuses a hello. That leader will listen for this
    // rendezvous soon, so both are retried until the connect deadline, like a refused connect.
    const bool closed_queued =
        o.status == ConnectOutcome::Status::kIo &&
        (o.io.status == common::IoStatus::kClosed ||
         (o.io.status == common::IoStatus::kError &&
          (o.io.error == ECONNRESET || o.io.error == EPIPE)));
    const bool between_rendezvous =
        o.status == ConnectOutcome::Status::kRefused &&
        o.detail.find("takes no rendezvous hello now") != std::string::npos;
    if (!(closed_queued || between_rendezvous) || common::Clock::now() >= deadline) {
      throw_handshake(*c, o);
    }
    last_error = o.status == ConnectOutcome::Status::kIo ? o.io.describe() : o.detail;
    MWMS_LOG_DEBUG(kBoot, "rendezvous: " << leader << " did not take our hello (" << last_error
                                         << "); it is not listening for this rendezvous yet, "
                                            "retrying");
    wait_log.tick([&] { return "rendezvous: waiting for " + leader + " to listen"; });
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
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
    const std::string text =
        c->task_name() + " got no rendezvous answer from " + leader + " after " +
        fmt_seconds(waited) + " of " + fmt_seconds(timeout) + " (MWMS_CONNECT_TIMEOUT_SECONDS, + " +
        fmt_seconds(kAnswerMarginSeconds) + " margin): " + r.describe() +
        " (is a libmwms task listening there, or another program holding that port?)";
    if (r.status == IoStatus::kTimeout) throw BootstrapTimeoutError(text, context_of(*c, 0));
    throw BootstrapError(text, context_of(*c, 0));
  }
  json reply = kind == MessageKind::kReply ? json::parse(text, nullptr, false) : json();
  bool ok = reply.is_object() && reply.contains("ok") && reply["ok"].is_boolean();
  if (ok && !reply["ok"].get<bool>()) {
    std::string why = reply.contains("error") && reply["error"].is_string()
                          ? reply["error"].get<std::string>()
                          : std::string("no reason given");
    // The leader's deadline expired (a task never arrived): a timeout here too.
    if (reply.contains("timeout") && reply["timeout"].is_boolean() &&
        reply["timeout"].get<bool>()) {
      throw BootstrapTimeoutError("rendezvous failed: " + why, context_of(*c, 0));
    }
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

namespace detail {

std::string fmt_seconds(double s) {
  std::ostringstream out;
  out.precision(1);
  out << std::fixed << s << " s";
  return out.str();
}

ErrorContext context_of(const ResolvedCluster& c, int peer) {
  return peer_context(c, "rendezvous", peer);
}

// Sources whose addresses are exchanged at start-up rather than listed in a spec: every rank's
// view of "the cluster" is then empty, and the leader learns the followers' addresses.
bool addresses_exchanged(const ResolvedCluster& c) {
  return c.source == ClusterSource::kMpi || c.source == ClusterSource::kTorchrun;
}

}  // namespace detail

RendezvousResult rendezvous(const ResolvedCluster& in, double connect_timeout_seconds,
                            PeerInfo mine) {
  RendezvousResult out{in, common::Socket(), {}};
  ResolvedCluster& c = out.cluster;
  common::set_log_rank(c.task_id, c.num_workers);
  mine.rank = c.task_id;
  if (mine.host_id.empty()) mine.host_id = local_host_id();
  if (mine.process.empty()) mine.process = local_process_id();
  if (mine.transport.empty()) mine.transport = "auto";
  // A bad MWMS_AUTH_KEY(_FILE) fails here, before anything listens, and also for a single
  // process: a setting that is wrong must not wait for the job to grow to be reported.
  auth_key_from_env();
  if (c.num_workers <= 1 || !c.in_ring) {
    if (!c.ring.empty()) mine.address = c.ring[0];
    out.peers.push_back(mine);
    assign_local_ranks(&out.peers);
    log_ring(c);
    return out;
  }
  Deadline deadline = common::deadline_after(connect_timeout_seconds);
  try {
    out.listener = open_listener(&c);
  } catch (const BootstrapError& e) {
    // Note [listen failure reported]: a follower whose leader's address is known tells it.
    if (c.task_id != 0 && !addresses_exchanged(c)) {
      tell_leader_cannot_listen(c, deadline, connect_timeout_seconds, mine, e.what());
    }
    throw;
  }
  mine.address = c.ring[c.task_id];
  out.peers.resize(static_cast<std::size_t>(c.num_workers));
  if (c.task_id == 0) {
    out.peers[0] = mine;
    detail::serve_hellos(&c, out.listener, deadline, connect_timeout_seconds, &out.peers);
  } else {
    join_leader(&c, deadline, connect_timeout_seconds, mine, &out.peers);
  }
  assign_local_ranks(&out.peers);
  log_ring(c);
  return out;
}

}  // namespace mwms::bootstrap
