// TF_CONFIG, TF1-style flags and explicit specs -> ResolvedCluster, with TensorFlow's rules
// (TFConfigClusterResolver + multi_worker_util): chief -> id 0, worker i -> i + number of chiefs,
// the chief (or worker 0 without a chief) leads, ps and evaluator stay out of the ring.
//
// Note [TF_CONFIG semantics]: the values follow CollectiveAllReduceExtended._initialize_strategy
// exactly, checked against TensorFlow itself over ~600 TF_CONFIGs
// (tests/data/tfconfig/tf_semantics_vectors.json, scripts/tf_semantics_vectors.py):
//  - TF_CONFIG "{}" and a "cluster" with no jobs at all ({}) are local training: a world of one,
//    chief, whatever "task" says (TF never reads the task then).
//  - Otherwise "task" with "type" and "index" is required, even for a one-task cluster, and a
//    listed job with no tasks counts: {"worker": []} with task worker 0 is out of range.
//  - An evaluator is chief of its own world of one (multi_worker_util.is_chief).
//  - "index" may be an integer, an integral number (1.0) or a decimal string ("1").
// Deliberate, documented differences, where TF accepts (docs/tf_config.md, the unit test's table):
// the text must be a JSON object with a "cluster" key (TF treats "[]" or a missing cluster as
// local), "master" and unknown task types are rejected even with an empty cluster, address syntax
// (port 1..65535, no scheme, bounded host names), duplicate addresses, loopback mixed with
// routable addresses, sparse dict jobs, an empty "chief" job next to workers (TF would then have
// no chief at all), a negative, fractional or boolean index, and the size limits of
// Note [bounded TF_CONFIG].
#include <cmath>
#include <cstdlib>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "mwms/cluster.h"
#include "bootstrap/json_text.h"
#include "mwms/errors.h"

namespace mwms {

namespace {

std::string in_quotes(std::string_view text) { return bootstrap::quote_value(text); }

std::string task_label(const TaskSpec& task) {
  return task.type + " " + std::to_string(task.index);
}

// "chief (1 task), worker (2 tasks)": what the cluster does hold, for "not in the cluster" errors.
std::string describe_jobs(const ClusterSpec& cluster) {
  if (cluster.jobs().empty()) return "the cluster is empty";
  std::string out = "the cluster has ";
  bool first = true;
  for (const auto& [job, addresses] : cluster.jobs()) {
    out += (first ? "" : ", ") + job + " (" + std::to_string(addresses.size()) +
           (addresses.size() == 1 ? " task)" : " tasks)");
    first = false;
  }
  return out;
}

ResolvedCluster world_of_one(const ClusterSpec& cluster, const TaskSpec& task) {
  ResolvedCluster r;
  r.cluster = cluster;
  r.task = task;
  r.task_id = 0;
  r.num_workers = 1;
  r.is_chief = true;
  r.in_ring = true;
  return r;
}

void check_task_type(const TaskSpec& task, std::string_view where) {
  const std::string& type = task.type;
  if (type == "chief" || type == "worker" || type == "ps" || type == "evaluator") return;
  if (type == "master") {
    throw BootstrapError(std::string(where) + ": task type \"master\" (task " + task_label(task) +
                         ") is not supported; rename the job \"chief\" in both \"cluster\" and " +
                         "\"task\" (TensorFlow 2 calls the leading task \"chief\")");
  }
  throw BootstrapError(std::string(where) + ": task " + in_quotes(task_label(task)) +
                       " has an unknown type " + in_quotes(type) +
                       "; allowed types are chief, worker, ps, evaluator");
}

// Shared by TF_CONFIG, flags and explicit specs: `cluster` is already validated.
// `local`: the cluster lists no job at all, which TF runs as local training (a world of one).
ResolvedCluster resolve_task(const ClusterSpec& cluster, const TaskSpec& task,
                             std::string_view where, bool local) {
  check_task_type(task, where);
  if (local) return world_of_one(cluster, task);
  int count = cluster.num_tasks(task.type);
  if (count == 0) {
    throw BootstrapError(std::string(where) + ": this process is task " + task_label(task) +
                         " but the cluster has no " + in_quotes(task.type) + " job (" +
                         describe_jobs(cluster) + ")");
  }
  if (task.index < 0 || task.index >= count) {
    throw BootstrapError(std::string(where) + ": task " + task_label(task) +
                         " is out of range: cluster." + task.type + " has " +
                         std::to_string(count) + (count == 1 ? " task" : " tasks") +
                         " (valid indexes 0.." + std::to_string(count - 1) + ")");
  }
  const std::string& address = cluster.task_address(task.type, task.index);
  int chiefs = cluster.num_tasks("chief");
  int workers = cluster.num_tasks("worker");
  if (task.type == "ps" && chiefs + workers == 0) {
    throw BootstrapError(std::string(where) + ": this process is task " + task_label(task) +
                         " at " + address + ", a parameter server, but the cluster has no chief "
                         "or worker to serve (" + describe_jobs(cluster) + ")");
  }
  ResolvedCluster r;
  r.cluster = cluster;
  r.task = task;
  if (task.type == "evaluator") {
    // TF keeps the evaluator outside the training cluster: it is its own world of one, and the
    // chief of it (multi_worker_util.is_chief returns True for "evaluator").
    r.task_id = 0;
    r.num_workers = 1;
    r.is_chief = true;
    r.in_ring = false;
    r.num_ps = cluster.num_tasks("ps");
    r.ring = {address};
    return r;
  }
  r.num_workers = chiefs + workers;
  r.num_ps = cluster.num_tasks("ps");
  // Note [ps rank]: a ps task has no id in TF's collective ring (multi_worker_util.id_in_cluster
  // raises for it); libmwms gives it the rank after every training task in the job mesh of the
  // parameter-server mode (ps_job_cluster), and keeps it out of every all-reduce ring.
  r.task_id = task.type == "chief" ? 0 : task.type == "ps" ? r.num_workers + task.index
                                                            : task.index + chiefs;
  r.is_chief = task.type == "chief" || (chiefs == 0 && task.type == "worker" && task.index == 0);
  r.in_ring = task.type != "ps";
  // Ring order is rank order: the chief, then workers in list order (never re-sorted by port).
  for (const char* job : {"chief", "worker"}) {
    auto it = cluster.jobs().find(job);
    if (it != cluster.jobs().end())
      r.ring.insert(r.ring.end(), it->second.begin(), it->second.end());
  }
  return r;
}

nlohmann::json parse_object(std::string_view text, std::string_view where, const char* expected) {
  nlohmann::json doc = bootstrap::parse_config_json(text, where);
  if (!doc.is_object()) {
    throw BootstrapError(std::string(where) + ": expected a JSON object " + expected +
                         ", got a JSON " + doc.type_name() + " (" +
                         bootstrap::printable(doc.dump()) + ")");
  }
  return doc;
}

std::optional<int> parse_index(const nlohmann::json& value, std::string_view where,
                               const std::string& type) {
  auto fail = [&]() -> std::optional<int> {
    throw BootstrapError(std::string(where) + ": task.index of the " + in_quotes(type) +
                         " task is " + bootstrap::printable(value.dump()) +
                         "; expected a non-negative integer such as 0 or 1");
  };
  long long index = 0;
  if (value.is_number_integer()) {
    index = value.get<long long>();
  } else if (value.is_number_float()) {
    double d = value.get<double>();
    if (!std::isfinite(d) || std::floor(d) != d || std::fabs(d) > 1e9) return fail();
    index = static_cast<long long>(d);
  } else if (value.is_string()) {
    const std::string& s = value.get_ref<const std::string&>();
    char* end = nullptr;
    index = std::strtoll(s.c_str(), &end, 10);
    bool ok = !s.empty() && end != nullptr && *end == '\0' &&
              (std::isdigit(static_cast<unsigned char>(s[0])) || s[0] == '-');
    if (!ok) return fail();
  } else {
    return fail();
  }
  if (index < std::numeric_limits<int>::min() || index > std::numeric_limits<int>::max()) {
    return fail();
  }
  return static_cast<int>(index);  // negative values are reported as out of range by the caller
}

// Returns no task when TF_CONFIG has none (absent, null or {}). `local`: the cluster lists no job,
// so TF never reads the task and a missing index is harmless.
std::optional<TaskSpec> parse_task(const nlohmann::json& doc, std::string_view where, bool local) {
  auto it = doc.find("task");
  if (it == doc.end() || it->is_null() || (it->is_object() && it->empty())) return std::nullopt;
  if (!it->is_object()) {
    throw BootstrapError(std::string(where) + ": \"task\" is a JSON " + it->type_name() +
                         "; expected {\"type\": \"worker\", \"index\": 0}");
  }
  auto type = it->find("type");
  if (type == it->end() || !type->is_string()) {
    throw BootstrapError(std::string(where) + ": \"task\" " + bootstrap::printable(it->dump()) +
                         " has " + (type == it->end() ? "no \"type\"" : "a non-string \"type\"") +
                         "; expected {\"type\": \"worker\", \"index\": 0}");
  }
  TaskSpec task;
  task.type = type->get<std::string>();
  auto index = it->find("index");
  if (index != it->end() && !index->is_null()) {
    task.index = *parse_index(*index, where, task.type);
  } else if (!local) {
    // TF: task_id None -> "you must also specify `task_type` and `task_id`", even for one task.
    throw BootstrapError(std::string(where) + ": \"task\" of type " + in_quotes(task.type) +
                         " has no \"index\"; say which task this process is, e.g. "
                         "{\"type\": " +
                         in_quotes(task.type) + ", \"index\": 0} (TensorFlow requires it too)");
  }
  return task;
}

// No "task" in a cluster with jobs: TF raises; list the tasks this process could be.
[[noreturn]] void throw_missing_task(const ClusterSpec& cluster, std::string_view where) {
  std::string listing;
  int training = 0;
  for (const char* job : {"chief", "worker"}) {
    for (int i = 0; i < cluster.num_tasks(job); ++i, ++training) {
      if (training < 8) {
        listing += (listing.empty() ? "" : ", ") + std::string(job) + " " + std::to_string(i) +
                   " at " + cluster.task_address(job, i);
      }
    }
  }
  if (training > 8) listing += ", ...";
  std::string why = training == 0
                        ? "the cluster has no chief or worker task (" + describe_jobs(cluster) + ")"
                        : "the cluster has " + std::to_string(training) + " training task" +
                              (training == 1 ? "" : "s") + " (" + listing + ")";
  throw BootstrapError(std::string(where) + ": no \"task\" but " + why +
                       "; every process needs \"task\": {\"type\": \"worker\", \"index\": N} "
                       "(TensorFlow requires it too)");
}

// {"chief": [], "worker": [...]}: TF then sees a chief job, so no worker is chief, and the chief
// task itself is out of range; nobody would lead. Deliberately rejected:
// Note [TF_CONFIG semantics].
void check_empty_chief(const nlohmann::json& jobs, std::string_view where) {
  auto it = jobs.find("chief");
  if (it == jobs.end() || !(it->is_array() || it->is_object()) || !it->empty()) return;
  throw BootstrapError(std::string(where) +
                       ": cluster.chief is listed with no task; TensorFlow "
                       "would then have no chief at all (worker 0 leads only when there is no "
                       "\"chief\" job): list the chief's address or remove the empty job");
}

std::string keys_of(const nlohmann::json& doc) {
  std::string keys;
  for (const auto& item : doc.items()) keys += (keys.empty() ? "" : ", ") + in_quotes(item.key());
  return keys;
}

}  // namespace

ResolvedCluster resolve_tf_config(std::string_view tf_config_json, std::string_view where) {
  nlohmann::json doc =
      parse_object(tf_config_json, where, "with \"cluster\" and \"task\" (TF_CONFIG)");
  ClusterSpec cluster;
  bool local = true;  // "{}" or "cluster": {} (Note [TF_CONFIG semantics])
  if (!doc.empty()) {
    auto it = doc.find("cluster");
    if (it == doc.end()) {
      std::string hint = doc.contains("sparseCluster")
                             ? " (\"sparseCluster\" is Kubeflow's sparse format, which "
                               "an all-reduce strategy cannot use: every task must be listed)"
                             : "";
      throw BootstrapError(std::string(where) + ": no \"cluster\" key; found keys " + keys_of(doc) +
                           hint +
                           ". Expected {\"cluster\": {\"worker\": [\"host:port\", ...]}, "
                           "\"task\": {\"type\": \"worker\", \"index\": 0}}");
    }
    if (!it->is_object()) {
      throw BootstrapError(std::string(where) + ": \"cluster\" is a JSON " + it->type_name() +
                           "; expected an object mapping job names to address lists");
    }
    local = it->empty();
    check_empty_chief(*it, where);
    cluster = ClusterSpec::from_json(it->dump(), where);
  }
  std::optional<TaskSpec> task = parse_task(doc, where, local);
  if (!task && !local) throw_missing_task(cluster, where);
  ResolvedCluster r = resolve_task(cluster, task ? *task : TaskSpec{"worker", 0}, where, local);
  r.source = ClusterSource::kTfConfig;
  r.source_detail = std::string(where);
  return r;
}

ResolvedCluster resolve_flags(std::string_view job_name, int task_index,
                              std::string_view cluster_spec_json) {
  constexpr std::string_view kWhere = "--cluster_spec";
  nlohmann::json doc =
      parse_object(cluster_spec_json, kWhere, "(a job map or {\"cluster\": {...}})");
  // Job names can never be "cluster", so its presence tells the two accepted shapes apart.
  auto it = doc.find("cluster");
  if (it != doc.end() && !it->is_object()) {
    throw BootstrapError(std::string(kWhere) + ": \"cluster\" is a JSON " + it->type_name() +
                         "; expected an object mapping job names to address lists");
  }
  const nlohmann::json& jobs = it != doc.end() ? *it : doc;
  check_empty_chief(jobs, kWhere);
  ClusterSpec cluster = ClusterSpec::from_json(jobs.dump(), kWhere);
  if (job_name.empty()) {
    throw BootstrapError("--job_name is empty; give chief, worker or evaluator with --task_index");
  }
  TaskSpec task{std::string(job_name), task_index};
  ResolvedCluster r =
      resolve_task(cluster, task, "--job_name/--task_index/--cluster_spec", jobs.empty());
  r.source = ClusterSource::kFlags;
  r.source_detail = "--job_name/--task_index/--cluster_spec";
  return r;
}

ResolvedCluster resolve_explicit(const ClusterSpec& cluster, const TaskSpec& task) {
  ResolvedCluster r =
      resolve_task(cluster, task, "explicit ClusterSpec/TaskSpec", cluster.jobs().empty());
  r.source = ClusterSource::kExplicit;
  r.source_detail = "explicit ClusterSpec/TaskSpec";
  return r;
}

std::string ResolvedCluster::task_name() const {
  if (source == ClusterSource::kMpi) return "mpi rank " + std::to_string(task_id);
  if (source == ClusterSource::kTorchrun) return "torchrun rank " + std::to_string(task_id);
  if (source == ClusterSource::kDefault) return "single process";
  return task.type + " " + std::to_string(task.index);
}

std::string ResolvedCluster::task_name_of_rank(int rank) const {
  if (source == ClusterSource::kMpi) return "mpi rank " + std::to_string(rank);
  if (source == ClusterSource::kTorchrun) return "torchrun rank " + std::to_string(rank);
  int chiefs = cluster.num_tasks("chief");
  int training = chiefs + cluster.num_tasks("worker");
  // Outside a TF ring (single process, evaluator, empty cluster) rank 0 is this process.
  if (source == ClusterSource::kDefault || (!in_ring && task.type != "ps") || training == 0) {
    return rank == 0 ? task_name() : "rank " + std::to_string(rank);
  }
  const int ps = cluster.num_tasks("ps");
  // Note [ps rank]: the ps tasks follow the training tasks in the parameter-server job mesh.
  if (rank >= training && rank < training + ps) return "ps " + std::to_string(rank - training);
  if (rank < 0 || rank >= training) return "rank " + std::to_string(rank);
  return rank < chiefs ? "chief " + std::to_string(rank)
                       : "worker " + std::to_string(rank - chiefs);
}

}  // namespace mwms
