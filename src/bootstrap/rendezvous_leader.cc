// The leader's side of the rendezvous (rendezvous.h): admits one hello per rank under the rules
// of Note [rendezvous admission] and answers every rank at once.
#include <sys/socket.h>

#include <cerrno>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "bootstrap/handshake.h"
#include "bootstrap/rendezvous_internal.h"
#include "common/logging.h"
#include "mwms/errors.h"

namespace mwms::bootstrap::detail {

namespace {

using common::Deadline;
using nlohmann::json;

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
// - Waiting on after a refusal must not look like a hang: each refusal is logged at warn when it
//   happens, saying that the leader keeps waiting for the tasks still missing and until when;
//   the periodic "waiting for" lines and the final timeout error give each missing task the
//   refusals of hellos that claimed it (source address and reason), and list the others apart.
//   With a key the same checks stop the job at once instead (the `authenticated` case of
//   admit()): only a holder of the key can send a proven hello, so its cluster, world size or
//   rank mismatch is a real task of this job started wrongly, and waiting out the timeout could
//   only end in the same error. Without a key that shortcut would let any client that can reach
//   the port stop the job, so the leader waits, and says so.
constexpr double kHelloSeconds = 3.0;
constexpr double kMismatchGraceSeconds = 5.0;
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
// The leader's view of who has joined (Note [rendezvous admission]).
struct Admission {
  std::vector<common::Socket> conns;  // by rank: the connection to answer
  std::vector<std::string> sources;   // by rank: its real source address
  std::vector<bool> seen;
  int arrived = 1;
  std::vector<std::string> refusals;  // the first kMaxRefusalsKept, for the timeout error
  std::map<int, std::vector<std::string>> refused_claims;  // by claimed rank, within the bound
  std::map<int, std::pair<Deadline, std::string>> mismatches;  // by rank: grace end, refusal
  std::string fatal;                  // the error that stops the job
  int fatal_rank = -1;                // the rank that reported it (Note [listen failure reported])
  std::string waiting_note;           // " for up to 60.0 s in all (...)", for the warning

  // Records a refusal of a hello claiming `rank` (-1: none readable); warns at once that the
  // leader keeps waiting (Note [rendezvous admission]); `grace` for a key mismatch, which stops
  // the job unless another connection proves the key for that rank.
  void refused(const std::string& text, int rank, const std::string& still_missing,
               const std::string& grace = "") {
    MWMS_LOG_WARN(kBoot, "rendezvous: refused " << text << "; still waiting for " << still_missing
                                                << (grace.empty() ? waiting_note : grace));
    if (refusals.size() >= kMaxRefusalsKept) return;
    refusals.push_back(text);
    if (rank >= 0) refused_claims[rank].push_back(text);
  }
};

// "worker 1 at localhost:2222" ("worker 1 (localhost:2222)" with `parens`, as in the timeout
// error) for each rank not yet admitted; with `refusals`, each followed by the refused hellos that
// claimed it, then the refusals that claimed no missing rank.
std::string missing_tasks(const ResolvedCluster& c, const Admission& a, bool refusals,
                          bool parens = false) {
  std::string list;
  for (int r = 1; r < c.num_workers; ++r) {
    if (a.seen[r]) continue;
    std::string where = c.ring[r].empty() ? std::string("address not announced") : c.ring[r];
    list += (list.empty() ? "" : ", ") + c.task_name_of_rank(r) +
            (parens ? " (" + where + ")" : " at " + where);
    auto it = a.refused_claims.find(r);
    if (!refusals || it == a.refused_claims.end()) continue;
    for (const std::string& text : it->second) list += " [its hello was refused: " + text + "]";
  }
  if (!refusals) return list;
  std::string others;
  for (const std::string& text : a.refusals) {
    bool listed = false;
    for (const auto& [r, texts] : a.refused_claims) {
      if (r <= 0 || r >= c.num_workers || a.seen[r]) continue;
      for (const std::string& t : texts) listed = listed || t == text;
    }
    if (!listed) others += (others.empty() ? "" : "; ") + text;
  }
  return others.empty() ? list : list + "; also refused: " + others;
}

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
      a->refused(from + ": " + error, rank, missing_tasks(*c, *a, false));
    }
    return;
  }
  if (h.contains("listen_error")) {
    // Note [listen failure reported] (rendezvous.cc): a task of this job that cannot listen.
    std::string why = h["listen_error"].is_string() ? h["listen_error"].get<std::string>()
                                                    : std::string("no reason given");
    if (why.size() > 1000) why = why.substr(0, 1000) + "...";
    a->fatal = why + " (reported to " + c->task_name() + " by " + c->task_name_of_rank(rank) +
               " from " + ev.source + "; every task stops)";
    a->fatal_rank = rank;
    send_message(ev.socket.fd(), MessageKind::kReply,
                 json{{"ok", false}, {"error", a->fatal}}.dump(), common::deadline_after(1));
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

// Note [answer after a stop]: a job stopped by one task's error (a reported listen failure, a
// proven mismatch) must not leave the tasks whose hellos were in flight with "connection reset
// by peer" from a leader that closed its listener under them. For up to kDrainSeconds (never past
// the deadline) the leader goes on answering every hello that passes the handshake with the
// job's error, until every rank has been answered.
constexpr double kDrainSeconds = 2.0;

void drain_with_error(const ResolvedCluster& c, HandshakeServer& server, const std::string& reply,
                      Deadline deadline, Admission* a) {
  std::vector<bool> answered = a->seen;
  if (a->fatal_rank > 0 && a->fatal_rank < c.num_workers) answered[a->fatal_rank] = true;
  const Deadline until = std::min(deadline, common::deadline_after(kDrainSeconds));
  auto missing = [&] {
    for (int r = 1; r < c.num_workers; ++r) {
      if (!answered[r]) return true;
    }
    return false;
  };
  while (missing() && common::Clock::now() < until) {
    std::optional<HandshakeEvent> ev = server.next(until);
    if (!ev || !ev->ok) continue;
    send_message(ev->socket.fd(), MessageKind::kReply, reply, common::deadline_after(1));
    const int r = ev->claim.rank;
    if (r > 0 && r < c.num_workers) answered[r] = true;
  }
}

}  // namespace

void serve_hellos(ResolvedCluster* c, const common::Socket& listener, Deadline deadline,
                  double timeout, std::vector<PeerInfo>* peers) {
  const int n = c->num_workers;
  const AuthKey& key = auth_key_from_env();
  HandshakeServer server(listener, key, {MessageKind::kHello}, kHelloSeconds);
  Admission a;
  a.conns.resize(n);
  a.sources.resize(n);
  a.seen.assign(n, false);
  a.waiting_note = " for up to " + fmt_seconds(timeout) +
                   " in all (MWMS_CONNECT_TIMEOUT_SECONDS; " +
                   (key.enabled() ? "a hello that did not prove MWMS_AUTH_KEY"
                                  : "without MWMS_AUTH_KEY an unproven hello") +
                   " cannot stop the job)";
  WaitLog wait_log(timeout);
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
      const bool grace = ev->key_mismatch && r > 0 && r < n && !a.seen[r];
      a.refused(text, r, missing_tasks(*c, a, false),
                grace ? " (the job stops " + fmt_seconds(kMismatchGraceSeconds) + " after the "
                        "first such refusal unless a task proves the key for " +
                        c->task_name_of_rank(r) + ")"
                      : std::string());
      if (grace && !a.mismatches.count(r)) {
        a.mismatches[r] = {common::deadline_after(kMismatchGraceSeconds), text};
      }
    }
    for (const auto& [r, m] : a.mismatches) {
      if (a.seen[r] || common::Clock::now() < m.first) continue;
      a.fatal = c->task_name() + " refused " + m.second + ", and no task proved the key for " +
                c->task_name_of_rank(r) + " within " + fmt_seconds(kMismatchGraceSeconds) +
                "; every task must have the same MWMS_AUTH_KEY (or MWMS_AUTH_KEY_FILE)";
      break;
    }
    wait_log.tick([&] { return "rendezvous: waiting for " + missing_tasks(*c, a, true); });
  }
  std::string error = a.fatal;
  const bool timed_out = error.empty() && a.arrived < n;
  if (timed_out) {
    // Note [rendezvous admission]: each missing task with the refused hellos that claimed it.
    error = c->task_name() + " (" + c->ring[0] + ") waited " + fmt_seconds(timeout) +
            " for every task to join the rendezvous; never arrived: " +
            missing_tasks(*c, a, true, true);
  }
  json all = json::array();
  for (const PeerInfo& p : *peers) all.push_back(to_json(p));
  json reply = error.empty() ? json{{"ok", true}, {"ring", c->ring}, {"peers", all}}
                             : json{{"ok", false}, {"error", error}, {"timeout", timed_out}};
  for (int r = 1; r < n; ++r) {
    if (a.conns[r].valid()) {
      send_message(a.conns[r].fd(), MessageKind::kReply, reply.dump(), common::deadline_after(5));
    }
  }
  if (!a.fatal.empty()) drain_with_error(*c, server, reply.dump(), deadline, &a);
  if (timed_out) throw BootstrapTimeoutError(error, context_of(*c));
  if (!error.empty()) throw BootstrapError(error, context_of(*c));
}

}  // namespace mwms::bootstrap::detail
