// The process environment -> ResolvedCluster, in TensorFlow's precedence: TF_CONFIG first (a TF
// job may well be launched under mpirun for other reasons), then an mpirun/PMI environment, then
// a single process. TF_CONFIG is read here and nowhere else in libmwms (STYLE item 24).
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <optional>
#include <string>

#include "common/logging.h"
#include "mwms/cluster.h"
#include "mwms/errors.h"

namespace mwms {

namespace {

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

// Strict decimal parse: launchers never write signs, spaces or suffixes into these variables, so
// anything else means a broken environment that must not silently become rank 0.
std::optional<int> env_int(const char* name) {
  const char* value = get_env(name);
  if (value == nullptr) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  long parsed = std::strtol(value, &end, 10);
  if (!std::isdigit(static_cast<unsigned char>(value[0])) || *end != '\0' || errno != 0 ||
      parsed > 1 << 30) {
    throw BootstrapError(std::string(name) + "=" + value + " is not a non-negative integer");
  }
  return static_cast<int>(parsed);
}

struct MpiVars {
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_rank_alt;  // MPICH/Hydra publishes the local rank under its own name
};

constexpr MpiVars kOpenMpi{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                           "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_NODE_RANK"};
constexpr MpiVars kPmi{"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "PMI_LOCAL_RANK"};

std::optional<ResolvedCluster> resolve_mpi(const MpiVars& vars) {
  std::optional<int> rank = env_int(vars.rank);
  std::optional<int> size = env_int(vars.size);
  if (!rank && !size) return std::nullopt;
  if (!rank || !size) {
    throw BootstrapError(std::string(rank ? vars.rank : vars.size) + " is set but " +
                         (rank ? vars.size : vars.rank) +
                         " is not; start the processes with mpirun or set both");
  }
  if (*size < 1 || *rank >= *size) {
    throw BootstrapError(std::string(vars.rank) + "=" + std::to_string(*rank) + " and " +
                         vars.size + "=" + std::to_string(*size) +
                         " are inconsistent: the rank must be below the size");
  }
  ResolvedCluster r;
  r.task = TaskSpec{"worker", *rank};
  r.task_id = *rank;
  r.num_workers = *size;
  r.is_chief = *rank == 0;
  r.in_ring = true;
  r.source = ClusterSource::kMpi;
  r.source_detail = std::string("mpirun environment (") + vars.rank + "/" + vars.size + ")";
  std::optional<int> local = env_int(vars.local_rank);
  if (!local) local = env_int(vars.local_rank_alt);
  r.local_rank = local.value_or(0);
  return r;
}

ResolvedCluster resolve_environment_once() {
  const char* tf_config = get_env("TF_CONFIG");
  if (tf_config != nullptr && !is_blank(tf_config)) {
    return resolve_tf_config(tf_config, "TF_CONFIG environment variable");
  }
  if (auto r = resolve_mpi(kOpenMpi)) return *r;
  if (auto r = resolve_mpi(kPmi)) return *r;
  ResolvedCluster r;
  r.task = TaskSpec{"worker", 0};
  r.source = ClusterSource::kDefault;
  r.source_detail = "no TF_CONFIG and no mpirun environment: a single process";
  return r;
}

}  // namespace

ResolvedCluster resolve_from_environment() {
  ResolvedCluster r = resolve_environment_once();
  std::string ring;
  for (const auto& address : r.ring) ring += (ring.empty() ? "" : " ") + address;
  MWMS_LOG_INFO(kBoot, "resolved " << r.task_name() << " from " << r.source_detail << ": rank "
                                   << r.task_id << "/" << r.num_workers << ", leader "
                                   << (r.is_chief ? "yes" : "no") << ", in ring "
                                   << (r.in_ring ? "yes" : "no") << ", cluster "
                                   << r.cluster.fingerprint() << ", ring [" << ring << "]");
  return r;
}

}  // namespace mwms
