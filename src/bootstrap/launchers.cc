// Readers of the launchers' environment variables (launchers.h). Every value is parsed strictly:
// launchers never write signs, spaces or suffixes, so anything else means a broken environment
// that must not silently become rank 0 of a world of one.
#include "bootstrap/launchers.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>

#include "bootstrap/hostlist.h"
#include "common/logging.h"
#include "mwms/errors.h"

namespace mwms::bootstrap {

namespace {

std::string plural(int n, const char* one, const char* many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

std::string quoted(const char* name, int value) {
  return std::string(name) + "=" + std::to_string(value);
}

// A rank/size pair from two variables; nullopt when neither is set.
struct RankSize {
  int rank = 0;
  int size = 0;
};

std::optional<RankSize> rank_size(const EnvLookup& env, const char* rank_name,
                                  const char* size_name, const char* launcher) {
  std::optional<int> rank = env_int(env, rank_name);
  std::optional<int> size = env_int(env, size_name);
  if (!rank && !size) return std::nullopt;
  if (!rank || !size) {
    throw BootstrapError(std::string(rank ? rank_name : size_name) + " is set but " +
                         (rank ? size_name : rank_name) + " is not; start the processes with " +
                         launcher + " or set both");
  }
  if (*size < 1 || *rank >= *size) {
    throw BootstrapError(quoted(rank_name, *rank) + " and " + quoted(size_name, *size) +
                         " are inconsistent: the rank must be below the size");
  }
  return RankSize{*rank, *size};
}

ResolvedCluster worker(int rank, int size, ClusterSource source, std::string detail) {
  ResolvedCluster r;
  r.task = TaskSpec{"worker", rank};
  r.task_id = rank;
  r.num_workers = size;
  r.is_chief = rank == 0;
  r.in_ring = true;
  r.source = source;
  r.source_detail = std::move(detail);
  return r;
}

LauncherView mpi_view(const EnvLookup& env, const RankSize& rs, const char* rank_name,
                      const char* size_name, const char* local, const char* local_alt) {
  LauncherView v;
  v.name = "mpi";
  v.who = "mpirun";
  v.resolved = worker(rs.rank, rs.size, ClusterSource::kMpi,
                      std::string("mpirun environment (") + rank_name + "/" + size_name + ")");
  std::optional<int> local_rank = env_int(env, local);
  if (!local_rank && local_alt != nullptr) local_rank = env_int(env, local_alt);
  v.resolved.local_rank = local_rank.value_or(0);
  v.size_text = "mpirun started " + plural(rs.size, "process", "processes") + " (" +
                quoted(size_name, rs.size) + ")";
  v.rank_text = "mpirun gives this process rank " + std::to_string(rs.rank) + " (" +
                quoted(rank_name, rs.rank) + ")";
  return v;
}

}  // namespace

std::optional<int> env_int(const EnvLookup& env, const char* name) {
  const char* value = env(name);
  if (value == nullptr) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  long parsed = std::strtol(value, &end, 10);
  if (!std::isdigit(static_cast<unsigned char>(value[0])) || *end != '\0' || errno != 0 ||
      parsed > 1 << 30) {
    std::string shown(value);
    if (shown.size() > 64) shown = shown.substr(0, 64) + "...";
    throw BootstrapError(std::string(name) + "=" + shown + " is not a non-negative integer");
  }
  return static_cast<int>(parsed);
}

std::optional<LauncherView> read_mpi(const EnvLookup& env) {
  if (auto rs = rank_size(env, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "mpirun")) {
    return mpi_view(env, *rs, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                    "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_NODE_RANK");
  }
  // PMIx (Open MPI 5's prterun, srun --mpi=pmix) always publishes PMIX_RANK; the size is a hint
  // some launchers add. A rank alone is a view that another launcher must complete.
  if (std::optional<int> rank = env_int(env, "PMIX_RANK")) {
    if (env_int(env, "PMIX_SIZE")) {
      auto rs = rank_size(env, "PMIX_RANK", "PMIX_SIZE", "mpirun");
      return mpi_view(env, *rs, "PMIX_RANK", "PMIX_SIZE", "PMIX_LOCAL_RANK", nullptr);
    }
    LauncherView v = mpi_view(env, RankSize{*rank, *rank + 1}, "PMIX_RANK", "PMIX_SIZE",
                              "PMIX_LOCAL_RANK", nullptr);
    v.size_known = false;
    v.size_text = "a PMIx launcher started this process (PMIX_RANK=" + std::to_string(*rank) +
                  ") without saying how many (no OMPI_COMM_WORLD_SIZE, no PMIX_SIZE)";
    return v;
  }
  if (auto rs = rank_size(env, "PMI_RANK", "PMI_SIZE", "mpirun")) {
    return mpi_view(env, *rs, "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "PMI_LOCAL_RANK");
  }
  return std::nullopt;
}

std::optional<LauncherView> read_torchrun(const EnvLookup& env) {
  auto rs = rank_size(env, "RANK", "WORLD_SIZE", "torchrun");
  if (!rs) return std::nullopt;
  LauncherView v;
  v.name = "torchrun";
  v.who = "torchrun";
  v.resolved = worker(rs->rank, rs->size, ClusterSource::kTorchrun,
                      "torchrun environment (RANK/WORLD_SIZE, rendezvous at MASTER_ADDR)");
  v.resolved.local_rank = env_int(env, "LOCAL_RANK").value_or(0);
  v.size_text = "torchrun started " + plural(rs->size, "process", "processes") + " (" +
                quoted("WORLD_SIZE", rs->size) + ")";
  v.rank_text = "torchrun gives this process rank " + std::to_string(rs->rank) + " (" +
                quoted("RANK", rs->rank) + ")";
  const char* host = env("MASTER_ADDR");
  std::optional<int> port = env_int(env, "MASTER_PORT");
  if (rs->size > 1 && (host == nullptr || !port)) {
    throw BootstrapError(v.size_text + " but " + (host == nullptr ? "MASTER_ADDR" : "MASTER_PORT") +
                         " is not set: rank 0's address is where the other ranks meet");
  }
  if (rs->size > 1) {
    // Note [torchrun rendezvous]: with torchrun's static rendezvous the agent itself serves its
    // store at MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True), so libmwms takes the next port.
    const char* agent = env("TORCHELASTIC_USE_AGENT_STORE");
    int ours = *port + (agent != nullptr && std::string(agent) == "True" ? 1 : 0);
    std::string h(host);
    std::string address = (h.find(':') != std::string::npos && h.front() != '[')
                              ? "[" + h + "]:" + std::to_string(ours)
                              : h + ":" + std::to_string(ours);
    split_address(address, "MASTER_ADDR/MASTER_PORT");  // validates host and port (<= 65535)
    v.resolved.ring = {address};
  }
  return v;
}

namespace {

// Task addresses in Note [slurm task order]; sets the node and local index of task `procid`.
std::vector<std::string> slurm_tasks(const std::vector<std::string>& nodes,
                                     const std::vector<int>& per_node, int port_base, int procid,
                                     std::string* my_node, int* my_local) {
  std::vector<std::string> tasks;
  for (std::size_t n = 0; n < nodes.size(); ++n) {
    if (port_base + per_node[n] - 1 > 65535) {
      throw BootstrapError("node " + nodes[n] + " runs " + std::to_string(per_node[n]) +
                           " tasks: ports from MWMS_SLURM_PORT_BASE=" + std::to_string(port_base) +
                           " would pass 65535");
    }
    for (int l = 0; l < per_node[n]; ++l) {
      if (static_cast<int>(tasks.size()) == procid) {
        *my_local = l;
        *my_node = nodes[n];
      }
      tasks.push_back(nodes[n] + ":" + std::to_string(port_base + l));
    }
  }
  return tasks;
}

}  // namespace

// Note [slurm task order]: as TF's SlurmClusterResolver, tasks are listed node by node in host
// list order and, on each node, by local id; task t of that list is SLURM_PROCID t and listens at
// its node's name and port_base + its local id. This is Slurm's default block distribution; with
// --distribution=cyclic the SLURM_LOCALID of a task contradicts the list, which is reported
// instead of forming a ring whose addresses point at the wrong processes.
std::optional<LauncherView> read_slurm(const EnvLookup& env, int port_base) {
  const char* ntasks_name = env("SLURM_NTASKS") != nullptr ? "SLURM_NTASKS" : "SLURM_NPROCS";
  std::optional<int> procid = env_int(env, "SLURM_PROCID");
  std::optional<int> ntasks = env_int(env, ntasks_name);
  if (!procid) return std::nullopt;
  if (!ntasks) {
    throw BootstrapError("SLURM_PROCID is set but SLURM_NTASKS is not: start the tasks with srun");
  }
  if (*ntasks < 1 || *procid >= *ntasks) {
    throw BootstrapError(quoted("SLURM_PROCID", *procid) + " and " + quoted(ntasks_name, *ntasks) +
                         " are inconsistent: the rank must be below the size");
  }
  LauncherView v;
  v.name = "slurm";
  v.who = "srun";
  v.size_text = "srun started " + plural(*ntasks, "task", "tasks") + " (" +
                quoted(ntasks_name, *ntasks) + ")";
  v.rank_text = "srun gives this process rank " + std::to_string(*procid) + " (" +
                quoted("SLURM_PROCID", *procid) + ")";
  std::optional<int> localid = env_int(env, "SLURM_LOCALID");
  v.resolved = worker(*procid, *ntasks, ClusterSource::kSlurm, "Slurm environment");
  v.resolved.local_rank = localid.value_or(0);
  if (*ntasks == 1) return v;

  const char* list_name = env("SLURM_STEP_NODELIST") != nullptr ? "SLURM_STEP_NODELIST"
                          : env("SLURM_JOB_NODELIST") != nullptr ? "SLURM_JOB_NODELIST"
                                                                 : "SLURM_NODELIST";
  const char* tpn_name = env("SLURM_STEP_TASKS_PER_NODE") != nullptr ? "SLURM_STEP_TASKS_PER_NODE"
                                                                      : "SLURM_TASKS_PER_NODE";
  if (env(list_name) == nullptr || env(tpn_name) == nullptr) {
    throw BootstrapError(v.size_text + " but " +
                         (env(list_name) == nullptr ? "no node list (SLURM_STEP_NODELIST, "
                                                      "SLURM_JOB_NODELIST)"
                                                    : "no task counts (SLURM_STEP_TASKS_PER_NODE)") +
                         " is set, so the tasks' addresses are unknown");
  }
  if (std::string(list_name) != "SLURM_STEP_NODELIST") {
    // The batch script itself (sbatch, no srun) also sees SLURM_NTASKS and the job's node list.
    MWMS_LOG_WARN(kBoot, "Slurm environment without SLURM_STEP_NODELIST: using "
                             << list_name << "; if this is the batch script rather than a task "
                             << "started by srun, start the program with srun");
  }
  std::vector<std::string> nodes = expand_hostlist(env(list_name), list_name);
  std::vector<int> per_node = parse_tasks_per_node(env(tpn_name), tpn_name);
  long total = 0;
  for (int n : per_node) total += n;
  if (per_node.size() != nodes.size() || total != *ntasks) {
    throw BootstrapError(std::string(list_name) + "=" + env(list_name) + " names " +
                         plural(static_cast<int>(nodes.size()), "node", "nodes") + " and " +
                         tpn_name + "=" + env(tpn_name) + " gives " +
                         plural(static_cast<int>(per_node.size()), "count", "counts") + " for " +
                         plural(static_cast<int>(total), "task", "tasks") + ", but " +
                         v.size_text + ": they must describe the same tasks");
  }
  int my_local = -1;
  std::string my_node;
  std::vector<std::string> tasks =
      slurm_tasks(nodes, per_node, port_base, *procid, &my_node, &my_local);
  const char* nodename = env("SLURMD_NODENAME");
  if ((localid && *localid != my_local) || (nodename != nullptr && my_node != nodename)) {
    throw BootstrapError(
        "SLURM_PROCID=" + std::to_string(*procid) + " is local task " + std::to_string(my_local) +
        " of " + my_node + " in block order, but this task has SLURM_LOCALID=" +
        (localid ? std::to_string(*localid) : std::string("?")) + " on " +
        (nodename != nullptr ? nodename : "?") +
        ": the tasks were not distributed in blocks (srun --distribution=block is needed, as "
        "for TF's SlurmClusterResolver)");
  }
  ResolvedCluster spec = resolve_explicit(ClusterSpec({{"worker", tasks}}), TaskSpec{"worker", *procid});
  spec.source = ClusterSource::kSlurm;
  spec.source_detail = std::string("Slurm environment (") + list_name + ", " + tpn_name +
                       ", ports from MWMS_SLURM_PORT_BASE " + std::to_string(port_base) + ")";
  spec.local_rank = v.resolved.local_rank;
  v.resolved = std::move(spec);
  return v;
}

}  // namespace mwms::bootstrap
