// What each launcher wrote into this process's environment (Note [launcher precedence] in
// resolver.cc): one reader per launcher, each returning a LauncherView or nothing when that
// launcher did not start this process. Readers take the environment as a lookup function so that
// tests can hand them a map; resolver.cc passes getenv.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "mwms/cluster.h"

namespace mwms::bootstrap {

/// Returns the value of a variable, or nullptr when it is unset or empty.
using EnvLookup = std::function<const char*(const char*)>;

/// One source's reading of the environment.
struct LauncherView {
  ResolvedCluster resolved;  // complete when world_size is known
  std::string name;          // "mpi", "torchrun", "slurm", "tf_config"
  std::string who;           // "mpirun", "torchrun", "srun", "TF_CONFIG" (for messages)
  bool size_known = true;    // false for a PMIx hint with a rank but no size
  std::string size_text;     // e.g. "mpirun started 2 processes (OMPI_COMM_WORLD_SIZE=2)"
  std::string rank_text;     // e.g. "mpirun gives this process rank 1 (OMPI_COMM_WORLD_RANK=1)"
};

/// Open MPI (OMPI_COMM_WORLD_*), then PMIx (PMIX_RANK with PMIX_SIZE; a rank alone gives a view
/// with size_known = false), then PMI (PMI_RANK/PMI_SIZE, MPICH/Hydra, srun --mpi=pmi2).
/// @throws BootstrapError quoting the variable: a non-decimal value, rank >= size, one of a
///   rank/size pair without the other.
std::optional<LauncherView> read_mpi(const EnvLookup& env);

/// torchrun / torch.distributed.launch: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT.
/// The view's ring holds only rank 0's address (Note [torchrun rendezvous] in rendezvous.cc).
/// @throws BootstrapError quoting the variable: as read_mpi, and MASTER_ADDR/MASTER_PORT missing
///   or malformed when WORLD_SIZE > 1.
std::optional<LauncherView> read_torchrun(const EnvLookup& env);

/// srun: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST)
/// and SLURM_STEP_TASKS_PER_NODE (else SLURM_TASKS_PER_NODE); task t listens at
/// node:port_base + local index, ordered as TF's SlurmClusterResolver orders them (Note [slurm
/// task order] in launchers.cc). @throws BootstrapError quoting the variable: malformed values,
/// SLURM_NTASKS > 1 without a node list or task counts, counts that do not add up, ports above
/// 65535, and a SLURM_LOCALID that contradicts block order (cyclic distribution).
std::optional<LauncherView> read_slurm(const EnvLookup& env, int port_base);

/// Parses a strict non-negative decimal (at most 2^30); nullopt when unset.
/// @throws BootstrapError "NAME=value is not a non-negative integer".
std::optional<int> env_int(const EnvLookup& env, const char* name);

}  // namespace mwms::bootstrap
