/// @file cluster.h
/// Cluster configuration: ClusterSpec, TaskSpec and the resolver that turns TF_CONFIG, an `mpirun`
/// environment, TF1-style flags or nothing at all into this process's rank, world size and ring.
/// Follows TensorFlow's TFConfigClusterResolver and multi_worker_util (task id: chief -> 0, worker i
/// -> i + number of chiefs; the chief, or worker 0 when there is no chief, is the leader).
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "mwms/api.h"

namespace mwms {

/// Job name -> ordered list of task addresses ("host:port", "[ipv6]:port" or "dns-name:port"),
/// as in tf.train.ClusterSpec. Allowed job names: chief, worker, ps, evaluator. A value type:
/// always valid once constructed; const members are thread-safe, none blocks.
class MWMS_API ClusterSpec {
 public:
  /// The empty cluster (no job): local training, a world of one.
  ClusterSpec() = default;
  /// Builds from a map; validates as from_json does. @throws BootstrapError on a bad spec.
  explicit ClusterSpec(std::map<std::string, std::vector<std::string>> jobs);

  /// Parses a JSON object {"worker": ["h:p", ...], "chief": [...], ...}; `where` names the source
  /// in messages (e.g. "TF_CONFIG cluster"). Validates job names, address syntax (empty address,
  /// missing/non-numeric port, port 0 or > 65535, an address over 261 bytes, a host over 253 or a
  /// label over 63 bytes are rejected naming `cluster.worker[1]`), at most one chief and one
  /// evaluator, duplicated addresses, and loopback names mixed with routable addresses.
  /// @throws BootstrapError; InvalidArgument for the limits of Note [bounded TF_CONFIG].
  static ClusterSpec from_json(std::string_view json, std::string_view where = "cluster");

  /// Jobs in name order.
  const std::map<std::string, std::vector<std::string>>& jobs() const noexcept { return jobs_; }
  /// Number of tasks of `job` (0 when absent).
  int num_tasks(std::string_view job) const;
  /// Address of task `index` of `job`. @throws BootstrapError when out of range.
  const std::string& task_address(std::string_view job, int index) const;
  /// Canonical JSON (sorted keys, no spaces): two processes hold the same cluster iff these match.
  std::string canonical_json() const;
  /// 64-bit FNV-1a of canonical_json(), printed in hex in logs and errors.
  std::string fingerprint() const;

 private:
  std::map<std::string, std::vector<std::string>> jobs_;
};

/// This process's task: job name and index within it, as in TF_CONFIG's "task".
struct MWMS_API TaskSpec {
  std::string type;  ///< "chief", "worker", "evaluator" or "ps"
  int index = 0;     ///< index within the job's list
};

/// Where a ResolvedCluster came from.
enum class ClusterSource { kTfConfig, kMpi, kFlags, kExplicit, kDefault, kSlurm, kTorchrun };

/// "tf_config", "mpi", "flags", "explicit", "default", "slurm" or "torchrun".
MWMS_API const char* source_name(ClusterSource source) noexcept;

/// What the bootstrap derived for this process. `ring` lists the training tasks' addresses in rank
/// order (chief first, then workers in list order); for an MPI job it is empty and for a torchrun
/// job it holds only rank 0's address (MASTER_ADDR:MASTER_PORT) until the rendezvous has
/// exchanged endpoints. A Slurm job lists every task (node:MWMS_SLURM_PORT_BASE + local id).
struct MWMS_API ResolvedCluster {
  /// The whole cluster: TF_CONFIG's, the flags' or the explicit one; for Slurm one "worker" job of
  /// every task; empty for MPI, torchrun and a process started with no source.
  ClusterSpec cluster;
  TaskSpec task;  ///< this process's task; {"worker", rank} for the launcher sources
  /// Rank in the ring (TF's id_in_cluster); 0 for an evaluator; for a ps task, num_workers +
  /// its index: its rank in the parameter-server job mesh, after every training task (TF gives
  /// a ps no id; no all-reduce ring ever holds it).
  int task_id = 0;
  int num_workers = 1;      ///< world size: chiefs + workers (1 for an evaluator)
  int num_ps = 0;           ///< tasks of the cluster's "ps" job (parameter servers)
  bool is_chief = true;     ///< leader: the chief, or worker 0 when there is no chief; an
                            ///< evaluator is chief of its own world (multi_worker_util.is_chief)
  bool in_ring = true;      ///< false for an evaluator (its own world of one) and for a ps task
                            ///< (it serves variables, mwms/parameter_server.h): neither ever
                            ///< joins an all-reduce ring
  std::vector<std::string> ring;  ///< addresses in rank order ("host:port")
  ClusterSource source = ClusterSource::kDefault;  ///< where the configuration came from
  std::string source_detail;      ///< e.g. "TF_CONFIG environment variable", "--tf_config FILE"
  int local_rank = 0;  ///< rank among processes on this host (from the launcher when known)

  /// "chief 0" / "worker 1" / "mpi rank 2" / "torchrun rank 2" / "single process", for messages.
  std::string task_name() const;
  /// Name of the task holding `rank` ("chief 0", "worker 1", "mpi rank 2", ...); "rank N" for a
  /// rank outside the ring. Never throws mwms::Error.
  std::string task_name_of_rank(int rank) const;
};

/// Resolves a TF_CONFIG JSON string with TensorFlow's rules (those of TFConfigClusterResolver,
/// multi_worker_util and CollectiveAllReduceExtended, checked against TF 2.21 over the vectors of
/// tests/data/tfconfig/tf_semantics_vectors.json). "{}" or a cluster with no job is local training
/// (a world of one); otherwise "task" with "type" and "index" is required. An evaluator resolves
/// to its own world of one (in_ring = false, is_chief = true). Unknown keys ("environment",
/// "rpc_layer", extra fields inside "task") are ignored. `where` names the source in errors.
/// @throws BootstrapError (naming task and address): malformed JSON, no "cluster" (naming the keys
///   that were found, e.g. Kubeflow's "sparseCluster"), missing "task"/"type"/"index", task type
///   not in the cluster, index out of range, two chiefs, a job name TF does not allow (a "master"
///   job gets a hint to use "chief"), a ps task in a cluster without chief or worker, and
///   libmwms's deliberate stricter
///   checks (docs/tf_config.md: address syntax and length, duplicates, loopback mixing, ...).
/// @throws InvalidArgument when the text breaks a limit of Note [bounded TF_CONFIG]: over 1 MiB,
///   invalid UTF-8, nesting over 16, over 4096 tasks, a number that does not fit a double.
/// Nothing else escapes (no nlohmann exception). Thread-safe; reads no environment.
MWMS_API ResolvedCluster resolve_tf_config(std::string_view tf_config_json,
                                           std::string_view where = "TF_CONFIG");

/// TF1-style: `--job_name`, `--task_index` and a cluster spec JSON (either {"cluster": {...}} or
/// the job map itself); errors name "--cluster_spec". Same rules and errors as resolve_tf_config;
/// thread-safe, reads no environment.
MWMS_API ResolvedCluster resolve_flags(std::string_view job_name, int task_index,
                                       std::string_view cluster_spec_json);

/// An explicit ClusterSpec and TaskSpec, validated with the same rules (an empty cluster is a world
/// of one). Thread-safe; reads no environment. @throws BootstrapError as resolve_tf_config does
/// (task type not in the cluster, index out of range, ...).
MWMS_API ResolvedCluster resolve_explicit(const ClusterSpec& cluster, const TaskSpec& task);

/// From the process environment, in one precedence (docs/launchers.md): TF_CONFIG when set and
/// non-empty; otherwise MPI (OMPI_COMM_WORLD_*, PMIX_RANK with PMIX_SIZE, PMI_RANK/PMI_SIZE);
/// otherwise torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT); otherwise Slurm's
/// srun (SLURM_PROCID, SLURM_NTASKS, SLURM_STEP_NODELIST, SLURM_STEP_TASKS_PER_NODE, ports from
/// MWMS_SLURM_PORT_BASE); otherwise one process, world size 1. Logs the chosen source at info.
/// Reads the environment on every call (MWMS_SLURM_PORT_BASE once per process).
/// @throws BootstrapError as resolve_tf_config does; naming both sources when two present sources
///   disagree on world size or rank (a launcher nested inside a Slurm allocation may disagree
///   with Slurm); when a launcher says the world is larger than one but gives no usable size or
///   addresses (PMIX_RANK alone, SLURM_NTASKS=4 without a node list); and quoting any malformed
///   launcher variable.
MWMS_API ResolvedCluster resolve_from_environment();

/// What one source present in the environment resolved (mwms-doctor --json "sources").
struct MWMS_API LaunchSourceReport {
  std::string source;   ///< source_name() of the source
  std::string detail;   ///< the variables it read
  int world_size = -1;  ///< -1 when unknown (PMIX_RANK without a size) or on error
  int rank = -1;        ///< the rank this source gives this process; -1 on error
  int local_rank = -1;  ///< rank among this host's processes (0 when not given); -1 on error
  std::string error;    ///< this source's own error (a malformed variable), else empty
};

/// What inspect_environment() found: every launcher source present in the environment with what
/// each resolved, the source resolve_from_environment() would choose, and the error it would raise.
struct MWMS_API EnvironmentReport {
  /// The sources that resolved, in precedence order (docs/launchers.md), then those whose
  /// variables were malformed (LaunchSourceReport::error set); empty when none is present.
  std::vector<LaunchSourceReport> sources;
  std::string chosen;  ///< source_name() of the chosen source (of the first one that failed to
                       ///< parse when none parsed), "default" when none is present
  /// What resolve_from_environment() would throw, as its what() text: the first malformed
  /// variable, or a conflict between two sources; empty when it would succeed.
  std::string error;
};

/// Diagnoses the launcher environment without resolving it (mwms-doctor --json "sources"): reads
/// the same variables as resolve_from_environment(), in the same precedence, and reports each
/// source present, the chosen one and the error resolve_from_environment() would raise (a
/// conflict, a malformed variable). Never throws mwms::Error: every failure is reported in
/// EnvironmentReport::error and LaunchSourceReport::error (std::bad_alloc may still escape).
/// Reads the environment on every call; connects nothing, so it does not block. Thread-safe as
/// long as no other thread changes the environment (setenv) meanwhile.
MWMS_API EnvironmentReport inspect_environment();

/// True for "localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback", any name under
/// ".localhost" (RFC 6761), 127.0.0.0/8, the IPv6 loopback and IPv4-mapped 127.x.x.x hosts;
/// case-insensitive, with or without brackets or a trailing dot. Textual only (no name lookup):
/// never blocks, never throws, thread-safe.
MWMS_API bool is_loopback_host(std::string_view host);

/// Splits "host:port" / "[v6]:port" into host and port in [1, 65535]; no name lookup,
/// thread-safe. @throws BootstrapError naming `where` and quoting the address: empty, over 261
/// bytes, white space, a URL scheme, '[' without ']', an empty host, no port, a non-numeric or
/// out of range port, an IPv6 address without brackets, an invalid host.
MWMS_API std::pair<std::string, int> split_address(std::string_view address,
                                                   std::string_view where = "address");

}  // namespace mwms
