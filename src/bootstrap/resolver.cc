// The process environment -> ResolvedCluster (Note [launcher precedence]). TF_CONFIG is read here
// and nowhere else in libmwms (STYLE item 24); the launchers' variables are read by launchers.cc.
//
// Note [launcher precedence]: one order, TF_CONFIG > MPI > torchrun > Slurm > one process.
// - TF_CONFIG first, as in TensorFlow: a TF job may well be launched by mpirun or srun for other
//   reasons, and TF_CONFIG is the most specific description (it names every address).
// - Launchers nest: mpirun and torchrun are commonly started inside a Slurm allocation (sbatch +
//   mpirun, srun + torchrun one per node), and their processes inherit the allocation's SLURM_*
//   variables, which describe the outer step (one task per node), not this process. So MPI and
//   torchrun win over Slurm, and when one of them is present a disagreeing Slurm is logged, not
//   an error.
// - Every other pair of present sources must agree on world size and rank: a TF_CONFIG that lists
//   1 worker under `mpirun -np 2` would otherwise give two silent worlds of one, each a "chief"
//   writing the same checkpoints. The error names both sources and their variables.
// - A launcher that started this process but gives no usable world size (PMIX_RANK alone, which
//   Open MPI 5 publishes before MPI_Init) or no addresses (SLURM_NTASKS=4 without a node list)
//   is an error, never a silent single process.
#include <cctype>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "bootstrap/launchers.h"
#include "common/env.h"
#include "common/logging.h"
#include "mwms/cluster.h"
#include "mwms/errors.h"

namespace mwms {

namespace {

using bootstrap::LauncherView;

const char* get_env(const char* name) {
  const char* value = std::getenv(name);
  return (value != nullptr && *value != '\0') ? value : nullptr;
}

bool is_blank(const char* text) {
  for (; *text != '\0'; ++text) {
    if (std::isspace(static_cast<unsigned char>(*text)) == 0) return false;
  }
  return true;
}

std::string plural(int n, const char* one, const char* many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

std::optional<LauncherView> read_tf_config() {
  const char* tf_config = get_env("TF_CONFIG");
  if (tf_config == nullptr || is_blank(tf_config)) return std::nullopt;
  LauncherView v;
  v.resolved = resolve_tf_config(tf_config, "TF_CONFIG environment variable");
  v.name = "tf_config";
  v.who = "TF_CONFIG";
  const ResolvedCluster& r = v.resolved;
  bool chief = r.cluster.num_tasks("chief") > 0;
  v.size_text = "TF_CONFIG lists " + (chief ? plural(r.num_workers, "training task (chief)",
                                                     "training tasks (chief and workers)")
                                            : plural(r.num_workers, "worker", "workers"));
  v.rank_text = "TF_CONFIG makes this process rank " + std::to_string(r.task_id) + " (" +
                r.task_name() + ")";
  return v;
}

int slurm_port_base() {
  long long base = common::env_int("MWMS_SLURM_PORT_BASE");
  if (base < 1 || base > 65535) {
    throw InvalidArgument("MWMS_SLURM_PORT_BASE=" + std::to_string(base) +
                          " is not a port in 1..65535");
  }
  return static_cast<int>(base);
}

struct SourceError {
  std::string source;
  std::string error;
};

// Every present source in precedence order. With `errors`, a source whose variables are malformed
// is recorded there and skipped; without, its error propagates.
std::vector<LauncherView> read_sources(std::vector<SourceError>* errors) {
  std::vector<LauncherView> views;
  const bootstrap::EnvLookup env = [](const char* name) { return get_env(name); };
  auto add = [&](const char* source, auto&& read) {
    try {
      if (auto v = read()) views.push_back(std::move(*v));
    } catch (const Error& e) {
      if (errors == nullptr) throw;
      errors->push_back({source, e.what()});
    }
  };
  add("tf_config", [] { return read_tf_config(); });
  add("mpi", [&] { return bootstrap::read_mpi(env); });
  add("torchrun", [&] { return bootstrap::read_torchrun(env); });
  add("slurm", [&]() -> std::optional<LauncherView> {
    if (get_env("SLURM_PROCID") == nullptr) return std::nullopt;
    return bootstrap::read_slurm(env, slurm_port_base());
  });
  return views;
}

// True when `v` is a Slurm view describing the allocation around a nested launcher.
bool outer_slurm(const LauncherView& v, const std::vector<LauncherView>& views) {
  if (v.name != "slurm") return false;
  for (const LauncherView& o : views) {
    if ((o.name == "mpi" || o.name == "torchrun") && o.size_known) return true;
  }
  return false;
}

// Picks the source (Note [launcher precedence]) and checks that the others agree with it.
// Returns the index of the chosen view, or -1 for a single process. @throws BootstrapError.
int choose(const std::vector<LauncherView>& views) {
  int chosen = -1;
  for (int i = 0; i < static_cast<int>(views.size()) && chosen < 0; ++i) {
    if (views[i].size_known) chosen = i;
  }
  if (chosen < 0) {
    if (views.empty()) return -1;
    throw BootstrapError(views[0].size_text +
                         ", and no other source gives the world size: set OMPI_COMM_WORLD_SIZE "
                         "or PMIX_SIZE, or launch with mpirun / srun / torchrun, or set TF_CONFIG");
  }
  const LauncherView& c = views[chosen];
  for (int i = 0; i < static_cast<int>(views.size()); ++i) {
    const LauncherView& o = views[i];
    if (i == chosen) continue;
    const ResolvedCluster& a = c.resolved;
    const ResolvedCluster& b = o.resolved;
    bool agree = (!o.size_known || a.num_workers == b.num_workers) && a.task_id == b.task_id;
    if (agree) continue;
    if (!a.in_ring || outer_slurm(o, views)) {
      MWMS_LOG_INFO(kBoot, "ignoring " << o.who << " (world size " << b.num_workers << ", rank "
                                       << b.task_id << "): "
                                       << (!a.in_ring ? "this task is an evaluator"
                                                      : "the allocation around " + c.who));
      continue;
    }
    std::string hint = "; every source present must describe the same job (unset the stale one)";
    if (o.size_known && a.num_workers != b.num_workers) {
      throw BootstrapError(c.size_text + " but " + o.size_text + hint);
    }
    throw BootstrapError(c.rank_text + " but " + o.rank_text + hint);
  }
  return chosen;
}

ResolvedCluster single_process() {
  ResolvedCluster r;
  r.task = TaskSpec{"worker", 0};
  r.source = ClusterSource::kDefault;
  r.source_detail = "no TF_CONFIG and no mpirun, torchrun or srun environment: a single process";
  return r;
}

}  // namespace

const char* source_name(ClusterSource source) noexcept {
  switch (source) {
    case ClusterSource::kTfConfig: return "tf_config";
    case ClusterSource::kMpi: return "mpi";
    case ClusterSource::kFlags: return "flags";
    case ClusterSource::kExplicit: return "explicit";
    case ClusterSource::kDefault: return "default";
    case ClusterSource::kSlurm: return "slurm";
    case ClusterSource::kTorchrun: return "torchrun";
  }
  return "unknown";
}

ResolvedCluster resolve_from_environment() {
  std::vector<LauncherView> views = read_sources(nullptr);
  int chosen = choose(views);
  ResolvedCluster r = chosen < 0 ? single_process() : views[chosen].resolved;
  std::string others;
  for (int i = 0; i < static_cast<int>(views.size()); ++i) {
    if (i != chosen) others += (others.empty() ? "" : ", ") + views[i].name;
  }
  std::string ring;
  for (const auto& address : r.ring) ring += (ring.empty() ? "" : " ") + address;
  MWMS_LOG_INFO(kBoot, "cluster source " << source_name(r.source) << " ("
                                         << r.source_detail << ")"
                                         << (others.empty() ? "" : ", also present: " + others));
  MWMS_LOG_INFO(kBoot, "resolved " << r.task_name() << ": rank " << r.task_id << "/"
                                   << r.num_workers << ", local rank " << r.local_rank
                                   << ", leader " << (r.is_chief ? "yes" : "no") << ", in ring "
                                   << (r.in_ring ? "yes" : "no") << ", cluster "
                                   << r.cluster.fingerprint() << ", ring [" << ring << "]");
  return r;
}

EnvironmentReport inspect_environment() {
  EnvironmentReport report;
  std::vector<SourceError> errors;
  std::vector<LauncherView> views;
  try {
    views = read_sources(&errors);
  } catch (const std::exception& e) {  // not a source's own error (e.g. the registry)
    report.error = e.what();
  }
  for (const LauncherView& v : views) {
    LaunchSourceReport s;
    s.source = v.name;
    s.detail = v.resolved.source_detail;
    s.world_size = v.size_known ? v.resolved.num_workers : -1;
    s.rank = v.resolved.task_id;
    s.local_rank = v.resolved.local_rank;
    report.sources.push_back(std::move(s));
  }
  for (const SourceError& e : errors) {
    LaunchSourceReport s;
    s.source = e.source;
    s.error = e.error;
    report.sources.push_back(std::move(s));
    if (report.error.empty()) report.error = e.error;
  }
  // A source that is present but fails to parse is the one the job would have used (it comes
  // before "default"), so the report names it rather than "default".
  report.chosen = errors.empty() ? "default" : errors.front().source;
  for (const LauncherView& v : views) {
    if (v.size_known) {
      report.chosen = v.name;  // what choose() picks, also when it then finds a conflict
      break;
    }
  }
  if (report.error.empty()) {
    try {
      choose(views);
    } catch (const Error& e) {
      report.error = e.what();
    }
  }
  return report;
}

}  // namespace mwms
