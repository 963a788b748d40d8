// TF_CONFIG, TF1-style flags and explicit specs -> ResolvedCluster, with TensorFlow's rules
// (TFConfigClusterResolver + multi_worker_util): chief -> id 0, worker i -> i + number of chiefs,
// the chief (or worker 0 without a chief) leads, ps and evaluator stay out of the ring.
//
// Choices where TensorFlow is silent or lenient (documented in docs/ by the bootstrap owner):
//  - TF_CONFIG "{}" and an empty "cluster" with no "task" (or task worker/chief 0) resolve to a
//    world of one, as TF runs such a process locally.
//  - No "task" is accepted only when the cluster has exactly one training task (chief or worker):
//    that task is this process. With more, which one we are is ambiguous, so it is an error.
//  - "index" may be an integer, an integral number (1.0) or an integer string ("1"), as TF's
//    int(task['index']) accepts; a missing index means 0 only when the job has a single task.
#include <cmath>
#include <cstdlib>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "mwms/cluster.h"
#include "mwms/errors.h"

namespace mwms {

namespace {

std::string in_quotes(std::string_view text) { return "\"" + std::string(text) + "\""; }

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
ResolvedCluster resolve_task(const ClusterSpec& cluster, const TaskSpec& task,
                             std::string_view where) {
  check_task_type(task, where);
  bool training = task.type == "chief" || task.type == "worker";
  if (cluster.jobs().empty() && training && task.index == 0) return world_of_one(cluster, task);
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
  if (task.type == "ps") {
    throw BootstrapError(std::string(where) + ": this process is task " + task_label(task) +
                         " at " + address +
                         ", a parameter server. An all-reduce strategy "
                         "(MultiWorkerMirroredStrategy) does not use parameter servers: do not "
                         "start this process (or remove the \"ps\" job from its launcher); only "
                         "chief and worker tasks train, an evaluator may run on its own");
  }
  ResolvedCluster r;
  r.cluster = cluster;
  r.task = task;
  if (task.type == "evaluator") {
    // TF keeps the evaluator outside the training cluster: it is its own world of one and does
    // not lead training (it never writes the training checkpoints).
    r.task_id = 0;
    r.num_workers = 1;
    r.is_chief = false;
    r.in_ring = false;
    r.ring = {address};
    return r;
  }
  int chiefs = cluster.num_tasks("chief");
  int workers = cluster.num_tasks("worker");
  r.task_id = task.type == "chief" ? 0 : task.index + chiefs;
  r.num_workers = chiefs + workers;
  r.is_chief = task.type == "chief" || (chiefs == 0 && task.index == 0);
  r.in_ring = true;
  // Ring order is rank order: the chief, then workers in list order (never re-sorted by port).
  for (const char* job : {"chief", "worker"}) {
    auto it = cluster.jobs().find(job);
    if (it != cluster.jobs().end())
      r.ring.insert(r.ring.end(), it->second.begin(), it->second.end());
  }
  return r;
}

nlohmann::json parse_object(std::string_view text, std::string_view where, const char* expected) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::parse_error& e) {
    // e.what() carries nlohmann's "at line L, column C" position.
    throw BootstrapError(std::string(where) + ": malformed JSON (" + e.what() + ")");
  }
  if (!doc.is_object()) {
    throw BootstrapError(std::string(where) + ": expected a JSON object " + expected +
                         ", got a JSON " + doc.type_name() + " (" + doc.dump().substr(0, 80) + ")");
  }
  return doc;
}

std::optional<int> parse_index(const nlohmann::json& value, std::string_view where,
                               const std::string& type) {
  auto fail = [&]() -> std::optional<int> {
    throw BootstrapError(std::string(where) + ": task.index of the " + in_quotes(type) +
                         " task is " + value.dump() +
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

// Returns no task when TF_CONFIG has none (absent, null or {}).
std::optional<TaskSpec> parse_task(const nlohmann::json& doc, const ClusterSpec& cluster,
                                   std::string_view where) {
  auto it = doc.find("task");
  if (it == doc.end() || it->is_null() || (it->is_object() && it->empty())) return std::nullopt;
  if (!it->is_object()) {
    throw BootstrapError(std::string(where) + ": \"task\" is a JSON " + it->type_name() +
                         "; expected {\"type\": \"worker\", \"index\": 0}");
  }
  auto type = it->find("type");
  if (type == it->end() || !type->is_string()) {
    throw BootstrapError(std::string(where) + ": \"task\" " + it->dump() + " has " +
                         (type == it->end() ? "no \"type\"" : "a non-string \"type\"") +
                         "; expected {\"type\": \"worker\", \"index\": 0}");
  }
  TaskSpec task;
  task.type = type->get<std::string>();
  auto index = it->find("index");
  if (index != it->end() && !index->is_null()) {
    task.index = *parse_index(*index, where, task.type);
  } else if (cluster.num_tasks(task.type) > 1) {
    throw BootstrapError(std::string(where) + ": \"task\" of type " + in_quotes(task.type) +
                         " has no \"index\" but cluster." + task.type + " has " +
                         std::to_string(cluster.num_tasks(task.type)) +
                         " tasks; say which one this process is");
  }
  return task;
}

// No "task": only unambiguous when the cluster has a single training task.
TaskSpec implied_task(const ClusterSpec& cluster, std::string_view where) {
  std::vector<TaskSpec> training;
  std::string listing;
  for (const char* job : {"chief", "worker"}) {
    for (int i = 0; i < cluster.num_tasks(job); ++i) {
      training.push_back(TaskSpec{job, i});
      listing += (listing.empty() ? "" : ", ") + std::string(job) + " " + std::to_string(i) +
                 " at " + cluster.task_address(job, i);
    }
  }
  if (cluster.jobs().empty()) return TaskSpec{"worker", 0};
  if (training.size() == 1) return training.front();
  std::string why = training.empty()
                        ? "the cluster has no chief or worker task (" + describe_jobs(cluster) + ")"
                        : "the cluster has " + std::to_string(training.size()) +
                              " training tasks (" + listing + ")";
  throw BootstrapError(std::string(where) + ": no \"task\" but " + why +
                       "; every process needs \"task\": {\"type\": \"worker\", \"index\": N}");
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
    cluster = ClusterSpec::from_json(it->dump(), where);
  }
  std::optional<TaskSpec> task = parse_task(doc, cluster, where);
  ResolvedCluster r = resolve_task(cluster, task ? *task : implied_task(cluster, where), where);
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
  ClusterSpec cluster = ClusterSpec::from_json((it != doc.end() ? *it : doc).dump(), kWhere);
  if (job_name.empty()) {
    throw BootstrapError("--job_name is empty; give chief, worker or evaluator with --task_index");
  }
  TaskSpec task{std::string(job_name), task_index};
  ResolvedCluster r = resolve_task(cluster, task, "--job_name/--task_index/--cluster_spec");
  r.source = ClusterSource::kFlags;
  r.source_detail = "--job_name/--task_index/--cluster_spec";
  return r;
}

ResolvedCluster resolve_explicit(const ClusterSpec& cluster, const TaskSpec& task) {
  ResolvedCluster r = resolve_task(cluster, task, "explicit ClusterSpec/TaskSpec");
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
  if (source == ClusterSource::kDefault || !in_ring || training == 0) {
    return rank == 0 ? task_name() : "rank " + std::to_string(rank);
  }
  if (rank < 0 || rank >= training) return "rank " + std::to_string(rank);
  return rank < chiefs ? "chief " + std::to_string(rank)
                       : "worker " + std::to_string(rank - chiefs);
}

}  // namespace mwms
