// mwms.Cluster and mwms.resolve*(): the C++ resolver (include/mwms/cluster.h), unchanged.
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <string>

#include "bindings.h"
#include "mwms/cluster.h"

namespace mwms::python {
namespace {

// A TF_CONFIG or cluster spec given as a dict is serialised by Python's json module; a str is
// passed as it is (the C++ parser reports its errors, naming `where`).
std::string json_text(nb::handle value) {
  if (nb::isinstance<nb::str>(value)) return nb::cast<std::string>(value);
  return nb::cast<std::string>(nb::module_::import_("json").attr("dumps")(value));
}

std::string repr(const ResolvedCluster& c) {
  return "Cluster(task='" + c.task_name() + "', rank=" + std::to_string(c.task_id) +
         ", world_size=" + std::to_string(c.num_workers) +
         ", is_chief=" + (c.is_chief ? "True" : "False") + ", source='" +
         source_name(c.source) + "')";
}

}  // namespace

void bind_cluster(nb::module_& m) {
  nb::class_<ResolvedCluster>(m, "Cluster",
      "What the resolver derived for this process (C++ ``mwms::ResolvedCluster``): its task, rank "
      "and world, and the whole cluster. Made by :func:`resolve` and its siblings; read-only.")
      .def_prop_ro("task_type", [](const ResolvedCluster& c) { return c.task.type; },
                   "Job of this task: ``'chief'``, ``'worker'``, ``'evaluator'`` or ``'ps'``.")
      .def_prop_ro("task_index", [](const ResolvedCluster& c) { return c.task.index; },
                   "Index of this task within its job.")
      .def_prop_ro("rank", [](const ResolvedCluster& c) { return c.task_id; },
                   "Rank in the ring, TF's task id: the chief is 0, worker i is i + the number "
                   "of chiefs. 0 for an evaluator; num_workers + index for a ps task.")
      .def_prop_ro("task_id", [](const ResolvedCluster& c) { return c.task_id; },
                   "The same as :attr:`rank` (TF's and the C++ API's name).")
      .def_prop_ro("world_size", [](const ResolvedCluster& c) { return c.num_workers; },
                   "Number of ranks in the ring: chiefs + workers (1 for an evaluator).")
      .def_prop_ro("num_workers", [](const ResolvedCluster& c) { return c.num_workers; },
                   "The same as :attr:`world_size` (TF's multi_worker_util.worker_count).")
      .def_prop_ro("num_ps", [](const ResolvedCluster& c) { return c.num_ps; },
                   "Tasks of the cluster's ``ps`` job.")
      .def_prop_ro("is_chief", [](const ResolvedCluster& c) { return c.is_chief; },
                   "True on the leader: the chief, or worker 0 when there is no chief.")
      .def_prop_ro("in_ring", [](const ResolvedCluster& c) { return c.in_ring; },
                   "False for an evaluator and a ps task, which never join an all-reduce ring.")
      .def_prop_ro("local_rank", [](const ResolvedCluster& c) { return c.local_rank; },
                   "Rank among the processes on this host, when the launcher says (else 0).")
      .def_prop_ro("cluster_spec",
                   [](const ResolvedCluster& c) { return c.cluster.jobs(); },
                   "The whole cluster as ``{job: [address, ...]}`` (tf.train.ClusterSpec's "
                   "as_dict()); empty for mpirun, torchrun and a single process.")
      .def_prop_ro("ring", [](const ResolvedCluster& c) { return c.ring; },
                   "The training tasks' addresses in rank order (empty for mpirun; rank 0's "
                   "address only for torchrun, until the rendezvous).")
      .def_prop_ro("source", [](const ResolvedCluster& c) { return source_name(c.source); },
                   "Where the configuration came from: ``'tf_config'``, ``'mpi'``, ``'flags'``, "
                   "``'explicit'``, ``'default'``, ``'slurm'`` or ``'torchrun'``.")
      .def_prop_ro("source_detail", [](const ResolvedCluster& c) { return c.source_detail; },
                   "The variables or flags the configuration was read from.")
      .def_prop_ro("task_name", &ResolvedCluster::task_name,
                   "This task for messages: ``'chief 0'``, ``'worker 1'``, ``'mpi rank 2'``, ...")
      .def("__repr__", &repr);

  m.def(
      "resolve",
      [](std::optional<nb::object> tf_config) {
        if (!tf_config || tf_config->is_none()) return resolve_from_environment();
        return resolve_tf_config(json_text(*tf_config), "tf_config argument");
      },
      nb::arg("tf_config") = nb::none(),
      nb::sig("def resolve(tf_config: str | dict | None = None) -> Cluster"),
      "Resolves this process's cluster exactly as the C++ resolver does.\n\n"
      "Without an argument, from the environment, in the C++ precedence (docs/launchers.md): "
      "``TF_CONFIG`` when set and non-empty; else ``mpirun`` (OMPI_COMM_WORLD_*, PMIX, PMI); "
      "else torchrun (RANK, WORLD_SIZE, MASTER_ADDR, ...); else Slurm's srun; else a single "
      "process (world size 1). With ``tf_config`` (a JSON string or a dict), that TF_CONFIG, "
      "with TensorFlow's rules. Connects nothing.\n\n"
      ":raises BootstrapError: a malformed or contradictory configuration, naming the task.\n"
      ":raises InvalidArgument: a TF_CONFIG beyond the limits (over 1 MiB, ...).");
  m.def(
      "resolve_flags",
      [](const std::string& job_name, int task_index, nb::object cluster_spec) {
        return resolve_flags(job_name, task_index, json_text(cluster_spec));
      },
      nb::arg("job_name"), nb::arg("task_index"), nb::arg("cluster_spec"),
      nb::sig("def resolve_flags(job_name: str, task_index: int, "
              "cluster_spec: str | dict) -> Cluster"),
      "TF1 style: ``--job_name``, ``--task_index`` and a cluster spec (``{job: [addresses]}`` "
      "or ``{'cluster': {...}}``, as a dict or JSON). Same rules and errors as :func:`resolve`.");
  m.def(
      "resolve_explicit",
      [](const std::map<std::string, std::vector<std::string>>& cluster_spec,
         const std::string& task_type, int task_index) {
        return resolve_explicit(ClusterSpec(cluster_spec), TaskSpec{task_type, task_index});
      },
      nb::arg("cluster_spec"), nb::arg("task_type"), nb::arg("task_index"),
      "An explicit cluster ``{job: [addresses]}`` and this process's task, validated with the "
      "same rules as :func:`resolve` (an empty cluster is a world of one).");
}

}  // namespace mwms::python
