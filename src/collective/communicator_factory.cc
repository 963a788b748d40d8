#include "collective/communicator_factory.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <map>

#include "bootstrap/error_context.h"
#include "bootstrap/local_address.h"
#include "bootstrap/rendezvous.h"
#include "collective/backend/engine_backend.h"
#include "collective/mesh/socket_mesh.h"
#include "collective/option_values.h"
#include "collective/transport/transport.h"
#include "common/descriptors.h"
#include "common/env.h"
#include "common/logging.h"
#include "mwms/errors.h"
#include "mwms/version.h"

namespace mwms::collective {

namespace {

// The table entry's name (or "auto") that CommunicatorOptions::transport or MWMS_TRANSPORT names
// (Note [transport table]). @throws InvalidArgument for a MWMS_TRANSPORT the table does not know.
std::string transport_choice(const std::optional<TransportChoice>& choice) {
  const std::optional<TransportChoice> c =
      transport_option(choice, "CommunicatorOptions::transport");
  if (c == TransportChoice::kAuto) return "auto";
  if (c == TransportChoice::kTcp) return "tcp";
  if (c == TransportChoice::kShm) return "shm";
  if (c == TransportChoice::kMpi) return "mpi";
  std::string value = common::env_string("MWMS_TRANSPORT");
  check_transport_choice(value);
  return value;
}

// Cores the ranks of this host can share. A launcher that binds each rank to its own core
// (mpirun's default) leaves one core in our affinity mask although the ranks do not share it:
// then the host's online cores count.
int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  int mask = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
  long online = ::sysconf(_SC_NPROCESSORS_ONLN);
  return std::max(1, mask > 1 ? mask : static_cast<int>(std::max(1L, online)));
}

Topology topology_of(const std::vector<bootstrap::PeerInfo>& peers) {
  Topology t;
  t.world_size = static_cast<int>(peers.size());
  std::map<std::string, int> per_host;
  for (const auto& p : peers) ++per_host[p.host_id];
  t.num_hosts = static_cast<int>(per_host.size());
  for (const auto& [host, n] : per_host) {
    t.max_ranks_per_host = std::max(t.max_ranks_per_host, n);
    t.uniform_hosts = t.uniform_hosts && n == per_host.begin()->second;
  }
  // From what every rank published (so every rank decides alike, even where ranks of one host
  // read different counts: CPU hotplug, a per-container view): a host's cores are the fewest
  // any of its ranks saw, and a rank that could not tell (0) says nothing.
  std::map<std::string, int> cores;
  for (const auto& p : peers) {
    if (p.online_cores <= 0) continue;
    auto [it, fresh] = cores.emplace(p.host_id, p.online_cores);
    if (!fresh) it->second = std::min(it->second, p.online_cores);
  }
  for (const auto& [host, c] : cores) {
    t.ranks_exceed_cores = t.ranks_exceed_cores || per_host[host] > c;
  }
  // Every rank must compute the same topology (the selector depends on it): look at every pair,
  // as choose_transports() decides it identically on every rank. Links of one transport give its
  // thresholds; a mix (shared memory inside hosts, TCP between them) the selector's defaults.
  const TransportEntry* uniform = nullptr;
  bool mixed = false;
  for (int r = 0; r < t.world_size; ++r) {
    for (const TransportEntry* e : choose_transports(r, peers)) {
      if (e == nullptr) continue;
      mixed = mixed || (uniform != nullptr && e != uniform);
      uniform = e;
    }
  }
  if (uniform != nullptr && !mixed) t.links = uniform->tuning;
  return t;
}

HostLayout host_layout_of(const std::vector<bootstrap::PeerInfo>& peers) {
  std::map<std::string, int> ids;
  std::vector<int> host_of;
  for (const auto& p : peers) {
    host_of.push_back(ids.emplace(p.host_id, static_cast<int>(ids.size())).first->second);
  }
  return HostLayout::from_hosts(host_of);
}

// Note [descriptor budget]: every rank checks every rank's need against the headroom it
// published, so all fail together, before anything connects, naming the same ranks.
void check_descriptor_budgets(const ResolvedCluster& c,
                              const std::vector<bootstrap::PeerInfo>& peers) {
  const int n = static_cast<int>(peers.size());
  const int streams = static_cast<int>(common::env_int("MWMS_NSOCKS_PERPEER"));
  std::string short_of;
  int first = -1;
  for (int r = 0; r < n; ++r) {
    const long headroom = peers[static_cast<std::size_t>(r)].fd_headroom;
    if (headroom < 0) continue;
    common::DescriptorBudget b;
    b.world_size = n;
    b.streams_per_peer = std::max(1, streams);
    for (const TransportEntry* e : choose_transports(r, peers)) {
      if (e != nullptr && e->count_descriptors != nullptr) e->count_descriptors(b);
    }
    if (b.total() <= headroom) continue;
    if (first < 0) first = r;
    short_of += (short_of.empty() ? "" : "; ") + c.task_name_of_rank(r) + " (" +
                peers[static_cast<std::size_t>(r)].address + ") may open " +
                std::to_string(headroom) + " more file descriptors under its limit (ulimit -n) "
                "but needs " + std::to_string(b.total()) + " for this job: " + b.describe() +
                "; raise its limit by at least " + std::to_string(b.total() - headroom);
  }
  if (first < 0) return;
  ErrorContext ctx = bootstrap::peer_context(c, "link setup", first);
  ctx.peer_address = peers[static_cast<std::size_t>(first)].address;  // as that peer published it
  throw BootstrapError("out of file descriptors: " + short_of +
                           " (ulimit -n, systemd LimitNOFILE, docker --ulimit nofile; or fewer "
                           "TCP streams, MWMS_NSOCKS_PERPEER); every task stops",
                       ctx);
}

// What connect_job() reads from the options and the environment, every value checked before
// anything connects (every rank alike, so a bad value fails every rank the same way).
struct JobSettings {
  double timeout = 0;
  double connect_timeout = 0;
  long long chunk = 0;
  long long small = 0;
  std::string transport;  // a table entry's name or "auto"
  std::string forced;     // a forced algorithm, "" or "auto" for the selector's choice
};

JobSettings read_settings(const ResolvedCluster& cluster, const CommunicatorOptions& options) {
  JobSettings s;
  s.timeout = seconds_option(options.timeout_seconds, "CommunicatorOptions::timeout_seconds",
                             "MWMS_TIMEOUT_SECONDS");
  s.connect_timeout = seconds_option(options.connect_timeout_seconds,
                                     "CommunicatorOptions::connect_timeout_seconds",
                                     "MWMS_CONNECT_TIMEOUT_SECONDS");
  s.chunk =
      bytes_option(options.chunk_bytes, "CommunicatorOptions::chunk_bytes", "MWMS_CHUNK_BYTES");
  if (s.chunk < 4096) throw InvalidArgument("chunk_bytes must be at least 4096");
  s.small = small_message_option(options.small_message_bytes);
  if (s.small < 0) throw InvalidArgument("MWMS_SMALL_MESSAGE_BYTES must be >= 0");
  s.transport = transport_choice(options.transport);
  s.forced = algorithm_option(options.algorithm);
  check_algorithm_name(s.forced);
  for (const std::string& name : common::unknown_env_vars()) {
    MWMS_LOG_WARN(kEnv, "unknown environment variable " << name << " ignored (see docs/env.md)");
  }
  if (!cluster.in_ring && cluster.num_workers > 1) {
    throw InvalidArgument("a task outside the training ring (" + cluster.task_name() +
                          ") is its own world of one, but num_workers is " +
                          std::to_string(cluster.num_workers));
  }
  return s;
}

TransportOptions transport_options(const ResolvedCluster& cluster, const JobSettings& s,
                                   const CommunicatorOptions& options, bool alone) {
  TransportOptions topts;
  topts.rank = cluster.task_id;
  topts.world_size = cluster.num_workers;
  topts.chunk_bytes = static_cast<std::size_t>(s.chunk) / 64 * 64;  // whole elements of any dtype
  if (bytes_option_set(options.chunk_bytes) || common::env_is_set("MWMS_CHUNK_BYTES")) {
    topts.mpi_piece_bytes = topts.chunk_bytes;  // an explicit chunk also sizes MPI's pieces
  }
  topts.job_fingerprint = cluster.cluster.fingerprint();
  // Note [local peers before the exchange] (local_address.cc).
  if (!alone) {  // a world of one creates no transport
    topts.may_share_host =
        s.transport != "auto" ||
        bootstrap::may_share_host(cluster.ring, cluster.task_id, cluster.num_workers);
  }
  return topts;
}

using LocalTransports = std::map<std::string, std::unique_ptr<Transport>>;  // by entry name

// Phase 1: the transports that publish an address in the peer-info exchange. Note [transport
// table]: under auto every automatic entry, else only the one named, offers itself; a transport
// this build, machine or setting does not offer publishes nothing.
LocalTransports offer_transports(const std::string& transport, const TransportOptions& topts,
                                 bootstrap::PeerInfo& mine) {
  LocalTransports local;
  for (const TransportEntry& e : transport_table()) {
    if (transport == "auto" ? !e.automatic : transport != e.name) continue;
    std::unique_ptr<Transport> t = e.create(topts);
    if (!t) continue;
    mine.blobs[e.name] = t->local_address();
    local[e.name] = std::move(t);
  }
  return local;
}

// Phase 2: a transport per pair; each checks its peers' blobs, then the mesh opens the control
// links and the sockets the transports ask for, then each transport connects its peers. Returns
// the links in rank order (null for this rank) and the mesh's control sockets.
std::vector<std::unique_ptr<Link>> connect_links(const bootstrap::RendezvousResult& rv,
                                                 LocalTransports& local, double connect_timeout,
                                                 MeshSockets& mesh, common::Deadline& deadline) {
  const ResolvedCluster& c = rv.cluster;
  const int n = c.num_workers;
  const std::vector<const TransportEntry*> chosen = choose_transports(c.task_id, rv.peers);
  ConnectContext cctx;
  cctx.rank = c.task_id;
  cctx.world_size = n;
  cctx.peers = &rv.peers;
  cctx.timeout_seconds = connect_timeout;
  for (int r = 0; r < n; ++r) cctx.task_names.push_back(c.task_name_of_rank(r));
  // The peers of each transport this rank uses, in table order (every rank alike).
  std::vector<std::pair<Transport*, std::vector<int>>> uses;
  MeshPlan plan;
  plan.transport.assign(static_cast<std::size_t>(n), "");
  plan.sockets.assign(static_cast<std::size_t>(n), 0);
  for (const TransportEntry& e : transport_table()) {
    std::vector<int> peers;
    for (int p = 0; p < n; ++p) {
      if (chosen[static_cast<std::size_t>(p)] == &e) peers.push_back(p);
    }
    if (peers.empty()) continue;
    Transport* t = local.count(e.name) != 0 ? local[e.name].get() : nullptr;
    MWMS_CHECK(t != nullptr, std::string("no ") + e.name + " transport");
    t->check_peers(peers, cctx);  // e.g. Note [stream count agreement] (tcp_transport.cc)
    for (int p : peers) {
      plan.transport[static_cast<std::size_t>(p)] = e.name;
      plan.sockets[static_cast<std::size_t>(p)] = t->mesh_sockets_per_peer();
    }
    uses.emplace_back(t, std::move(peers));
  }
  check_descriptor_budgets(c, rv.peers);  // Note [descriptor budget] (common/descriptors.cc)
  mesh = connect_mesh(c, rv.listener, plan, connect_timeout);
  deadline = cctx.deadline = common::deadline_after(connect_timeout);
  cctx.sockets = &mesh.data;
  std::vector<std::unique_ptr<Link>> links(static_cast<std::size_t>(n));
  for (auto& [t, peers] : uses) {
    std::vector<std::unique_ptr<Link>> got = t->connect(peers, cctx);
    for (std::size_t i = 0; i < peers.size(); ++i) {
      links[static_cast<std::size_t>(peers[i])] = std::move(got[i]);
    }
  }
  return links;
}

// The control plane over the mesh's control sockets, after every rank's links are up (its ready
// barrier), with the heartbeat running (Note [heartbeat], engine/control_plane.h).
std::unique_ptr<ControlPlane> start_control_plane(const bootstrap::RendezvousResult& rv,
                                                  MeshSockets& mesh, common::Deadline deadline) {
  const ResolvedCluster& c = rv.cluster;
  PeerNames names;
  names.addresses = c.ring;
  for (int r = 0; r < c.num_workers; ++r) {
    names.tasks.push_back(c.task_name_of_rank(r));
    const bootstrap::PeerInfo& p = rv.peers[static_cast<std::size_t>(r)];
    const bool here = p.host_id == rv.peers[static_cast<std::size_t>(c.task_id)].host_id;
    names.processes.push_back(here && r != c.task_id ? p.process : std::string());
  }
  auto control = std::make_unique<ControlPlane>(c.task_id, std::move(mesh.control), names);
  const ErrorContext setup = bootstrap::task_context(c, "link setup");
  control->ready_barrier(deadline, setup);
  const double heartbeat = common::env_double("MWMS_HEARTBEAT_SECONDS");
  if (heartbeat < 0) throw InvalidArgument("MWMS_HEARTBEAT_SECONDS must be >= 0", setup);
  control->start_heartbeat(heartbeat, bootstrap::task_context(c, "heartbeat"));
  return control;
}

EngineOptions engine_options(const bootstrap::RendezvousResult& rv, const JobSettings& s,
                             std::size_t chunk_bytes) {
  const ResolvedCluster& c = rv.cluster;
  EngineOptions eopts;
  eopts.timeout_seconds = s.timeout;
  eopts.runner.chunk_bytes = chunk_bytes;
  eopts.runner.spin_seconds =
      static_cast<double>(common::env_int("MWMS_SPIN_MICROSECONDS")) * 1e-6;
  // Note [stall warning] (engine/plan_runner.cc): unset, at most a quarter of the timeout.
  double stall_warn = common::env_double("MWMS_STALL_WARN_SECONDS");
  if (stall_warn < 0) {
    throw InvalidArgument("MWMS_STALL_WARN_SECONDS must be >= 0",
                          bootstrap::task_context(c, "link setup"));
  }
  if (!common::env_is_set("MWMS_STALL_WARN_SECONDS")) {
    stall_warn = std::min(stall_warn, s.timeout / 4);
  }
  eopts.runner.stall_warn_seconds = stall_warn;
  eopts.runner.yield_while_spinning =
      rv.peers[static_cast<std::size_t>(c.task_id)].local_size > usable_cores();
  eopts.selector.forced = s.forced;
  eopts.selector.small_message_bytes = static_cast<std::size_t>(s.small);
  eopts.topology = topology_of(rv.peers);
  eopts.hosts = host_layout_of(rv.peers);
  return eopts;
}

}  // namespace

ConnectedJob connect_job(const ResolvedCluster& cluster, const CommunicatorOptions& options) {
  const JobSettings s = read_settings(cluster, options);
  const bool alone = cluster.num_workers <= 1 || !cluster.in_ring;
  const TransportOptions topts = transport_options(cluster, s, options, alone);
  bootstrap::PeerInfo mine;
  mine.transport = s.transport;
  LocalTransports local;
  if (!alone) local = offer_transports(s.transport, topts, mine);
  mine.fd_headroom = alone ? -1 : common::descriptor_headroom();  // Note [descriptor budget]
  mine.online_cores = static_cast<int>(std::clamp(::sysconf(_SC_NPROCESSORS_ONLN), 0L, 1L << 20));
  bootstrap::RendezvousResult rv = bootstrap::rendezvous(cluster, s.connect_timeout, mine);
  // Without a launcher's local rank, the host ids of the exchange give it.
  if (rv.cluster.source != ClusterSource::kMpi && !rv.peers.empty()) {
    rv.cluster.local_rank = rv.peers[static_cast<std::size_t>(rv.cluster.task_id)].local_rank;
  }
  if (rv.cluster.is_chief) {
    MWMS_LOG_INFO(kInit, "libmwms " << MWMS_VERSION_STRING);
    for (const auto& var : common::env_registry()) {
      MWMS_LOG_INFO(kEnv, var.name << " " << common::env_value_for_log(var.name));
    }
  }
  ConnectedJob job;
  job.timeout_seconds = s.timeout;
  job.engine.timeout_seconds = s.timeout;
  if (alone) {
    job.links.resize(1);  // a world of one still copies (reduce-scatter into recv, ...)
    job.cluster = std::move(rv.cluster);
    return job;
  }
  MeshSockets mesh;
  common::Deadline deadline;
  job.links = connect_links(rv, local, s.connect_timeout, mesh, deadline);
  job.control = start_control_plane(rv, mesh, deadline);
  job.engine = engine_options(rv, s, topts.chunk_bytes);
  job.peers = std::move(rv.peers);
  job.cluster = std::move(rv.cluster);
  return job;
}

std::unique_ptr<Communicator> create_communicator(const ResolvedCluster& cluster,
                                                  const CommunicatorOptions& options) {
  if (options.implementation == Implementation::kNccl) {
    throw InvalidArgument("Implementation::kNccl is for device buffers: Communicator carries host "
                          "buffers over the engine (use kAuto or kRing); for GPU buffers create a "
                          "DeviceCommunicator (mwms/device_communicator.h) with kNccl");
  }
  if (cluster.task.type == "ps") {
    const std::string at = cluster.task.index < cluster.cluster.num_tasks("ps")
                               ? " at " + cluster.cluster.task_address("ps", cluster.task.index)
                               : std::string();
    throw BootstrapError(
        "this process is task " + cluster.task_name() + at + ", a parameter server. An "
        "all-reduce strategy (MultiWorkerMirroredStrategy, Communicator) does not use parameter "
        "servers: run it as a ParameterServerStrategy (mwms/parameter_server.h; `train` does "
        "when the cluster has a \"ps\" job), or remove the \"ps\" job from its launcher");
  }
  ConnectedJob job = connect_job(cluster, options);
  const int rank = job.cluster.task_id;
  auto backend = std::make_unique<EngineBackend>(job.control ? rank : 0, std::move(job.links),
                                                 std::move(job.control), job.engine);
  if (job.cluster.is_chief && job.cluster.num_workers > 1) {
    MWMS_LOG_INFO(kInit, "libmwms communicator ready: world size " << job.cluster.num_workers
                                                                   << ", " << backend->describe());
  }
  return make_front_end(std::move(job.cluster), std::move(backend), job.timeout_seconds);
}

}  // namespace mwms::collective
