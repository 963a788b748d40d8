// mwms.MultiWorkerMirroredStrategy over include/mwms/strategy.h. Its blocking calls run on the
// calling thread with the GIL released; Ctrl-C aborts the strategy's communicator (Note [python
// interrupts]).
#include "strategy.h"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/variant.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "buffers.h"
#include "communicator.h"
#include "interrupt.h"
#include "mwms/errors.h"
#include "mwms/strategy.h"

namespace mwms::python {
namespace {

Implementation to_implementation(const std::string& name) {
  if (name == "auto") return Implementation::kAuto;
  if (name == "ring") return Implementation::kRing;
  if (name == "nccl") return Implementation::kNccl;
  throw InvalidArgument("argument 'implementation' is '" + name +
                        "'; expected 'auto', 'ring' or 'nccl'");
}

Compression to_compression(const std::string& name) {
  if (name == "none") return Compression::kNone;
  if (name == "fp16" || name == "float16") return Compression::kFloat16;
  if (name == "bf16" || name == "bfloat16") return Compression::kBFloat16;
  throw InvalidArgument("argument 'compression' is '" + name +
                        "'; expected 'none', 'fp16' or 'bf16'");
}

}  // namespace

PyStrategy::PyStrategy(const ResolvedCluster& cluster, const CommunicationOptions& options,
                       const ReplicaOptions& replicas) {
  // On a Job (the rendezvous has nothing to abort yet), which owns what it builds.
  auto built = std::make_shared<std::unique_ptr<MultiWorkerMirroredStrategy>>();
  Job::run([built, cluster, options, replicas] {
    *built = std::make_unique<MultiWorkerMirroredStrategy>(cluster, options, replicas);
  });
  strategy_ = std::move(*built);
}

PyStrategy::~PyStrategy() {
  nb::gil_scoped_release nogil;
  strategy_.reset();
}

void PyStrategy::collective_on_tensors(const char* op, nb::handle tensors, bool gradients,
                                       ReduceOp rop) {
  std::vector<Buffer> buffers;  // hold the imports while the call runs
  std::vector<TensorRef> refs;
  std::size_t i = 0;
  for (nb::handle t : tensors) {
    const std::string name = (gradients ? "gradients[" : "variables[") + std::to_string(i++) + "]";
    buffers.push_back(import_buffer(t, name.c_str(), true));
    refs.push_back(TensorRef{buffers.back().data, buffers.back().count, buffers.back().dtype});
  }
  MultiWorkerMirroredStrategy* s = strategy_.get();
  if (gradients) {
    run(op, [s, &refs, rop] { s->all_reduce_gradients(refs, rop); });
  } else {
    run(op, [s, &refs] { s->broadcast_variables(refs); });
  }
}

void bind_strategy(nb::module_& m) {
  nb::class_<PyStrategy> cls(
      m, "MultiWorkerMirroredStrategy",
      "Synchronous data-parallel training across workers (tf.distribute."
      "MultiWorkerMirroredStrategy; C++ ``mwms::MultiWorkerMirroredStrategy``).\n\n"
      "Every worker holds a mirror of the variables (:meth:`broadcast_variables` makes them the "
      "chief's), computes gradients on its shard of the global batch (:meth:`batch_shard`), "
      "and :meth:`all_reduce_gradients` sums them across workers in buckets of "
      "``bytes_per_pack``, in place, so every worker applies the same update. Scale the loss by "
      "the global batch size (tf.nn.compute_average_loss): N workers then follow one worker on "
      "the global batch. Collective methods must be called by every worker in the same order "
      "with the same shapes; they release the GIL and Ctrl-C interrupts them (aborting the "
      "strategy's communicator). One thread at a time. With ``local_replicas`` K > 1, :meth:`run` "
      "calls a replica function on K threads, each with its own copy of the variables, and "
      ":class:`ReplicaContext`'s collectives reduce across every replica of every worker "
      "(Note [python replicas]).");
  cls.def(
      "__init__",
      [](PyStrategy* self, std::optional<ResolvedCluster> cluster,
         const std::string& implementation, std::optional<std::size_t> bytes_per_pack,
         std::optional<double> timeout_seconds, const std::string& compression,
         int local_replicas) {
        CommunicationOptions o;  // None: unset (Note [option sentinels], mwms/options.h)
        o.implementation = to_implementation(implementation);
        o.bytes_per_pack = bytes_per_pack;
        o.timeout_seconds = timeout_seconds;
        o.compression = to_compression(compression);
        ReplicaOptions replicas;
        replicas.local_replicas = local_replicas;
        new (self) PyStrategy(cluster ? *cluster : resolve_from_environment(), o, replicas);
      },
      nb::arg("cluster") = nb::none(), nb::kw_only(), nb::arg("implementation") = "auto",
      nb::arg("bytes_per_pack") = nb::none(), nb::arg("timeout_seconds") = nb::none(),
      nb::arg("compression") = "none", nb::arg("local_replicas") = 1,
      "Resolves the cluster (default: :func:`resolve`) and forms the ring; blocks until every "
      "worker has connected. Options as tf.distribute.experimental.CommunicationOptions: "
      "``implementation`` (``'auto'``, ``'ring'``; ``'nccl'`` needs GPU buffers, not bound), "
      "``bytes_per_pack`` (None: MWMS_BYTES_PER_PACK, 4 MiB), ``timeout_seconds`` (None: "
      "MWMS_TIMEOUT_SECONDS; 0 still means None, deprecated), ``compression`` of float32 "
      "gradients on the wire (``'none'``, ``'fp16'``, ``'bf16'``); ``local_replicas``, K "
      "replicas per worker (TF's MirroredStrategy inside each worker: :meth:`run` calls the "
      "replica function on K threads; in [1, 64], the same on every worker).\n\n"
      ":raises BootstrapError: as Communicator().\n:raises InvalidArgument: K outside [1, 64], "
      "or workers with different K (naming them).");
  cls.def_prop_ro(
         "num_replicas_in_sync", [](PyStrategy& s) { return s.get().num_replicas_in_sync(); },
         "Replicas across all workers: num_workers x num_local_replicas.")
      .def_prop_ro(
          "num_local_replicas", [](PyStrategy& s) { return s.get().num_local_replicas(); },
          "K, this worker's local replicas (the same on every worker).")
      .def_prop_ro(
          "num_workers", [](PyStrategy& s) { return s.get().num_workers(); },
          "Number of workers in the ring.")
      .def_prop_ro(
          "worker_index", [](PyStrategy& s) { return s.get().worker_index(); },
          "This worker's rank (TF task id).")
      .def_prop_ro(
          "is_chief", [](PyStrategy& s) { return s.get().is_chief(); },
          "True on the leader (chief, or worker 0 without a chief): checkpoints, logs.")
      .def_prop_ro(
          "cluster", [](PyStrategy& s) { return s.get().cluster(); }, "The resolved cluster.")
      .def_prop_ro(
          "bytes_per_pack", [](PyStrategy& s) { return *s.get().options().bytes_per_pack; },
          "Bucket size in effect, in bytes.")
      .def_prop_ro(
          "timeout_seconds", [](PyStrategy& s) { return *s.get().options().timeout_seconds; },
          "Deadline in effect for every collective, in seconds.")
      .def_prop_ro(
          "all_reduce_seconds", [](PyStrategy& s) { return s.get().all_reduce_seconds(); },
          "Seconds spent in all_reduce_gradients so far (wall clock).")
      .def_prop_ro(
          "all_reduce_bytes", [](PyStrategy& s) { return s.get().all_reduce_bytes(); },
          "Bytes all-reduced by all_reduce_gradients so far.")
      // The old spellings ("allreduce"): kept for one release, with a DeprecationWarning.
      .def_prop_ro(
          "allreduce_seconds",
          [](PyStrategy& s) {
            if (PyErr_WarnEx(PyExc_DeprecationWarning,
                             "allreduce_seconds is deprecated: use all_reduce_seconds", 1) != 0) {
              throw nb::python_error();
            }
            return s.get().all_reduce_seconds();
          },
          "Deprecated spelling of all_reduce_seconds.")
      .def_prop_ro(
          "allreduce_bytes",
          [](PyStrategy& s) {
            if (PyErr_WarnEx(PyExc_DeprecationWarning,
                             "allreduce_bytes is deprecated: use all_reduce_bytes", 1) != 0) {
              throw nb::python_error();
            }
            return s.get().all_reduce_bytes();
          },
          "Deprecated spelling of all_reduce_bytes.");
  cls.def(
      "batch_shard",
      [](PyStrategy& s, std::size_t global_batch_size) {
        Shard shard = s.get().batch_shard(global_batch_size);
        return nb::slice(nb::int_(shard.begin), nb::int_(shard.end), nb::none());
      },
      nb::arg("global_batch_size"),
      nb::sig("def batch_shard(self, global_batch_size: int) -> slice"),
      "This worker's rows of a global batch, as a slice: contiguous, sizes differing by at most "
      "one (the first global_batch_size % num_workers workers get one more); with K > 1 local "
      "replicas, the union of this worker's replicas' rows (ReplicaContext.batch_shard). "
      "``x[strategy.batch_shard(len(x))]`` is this worker's part. Does not block.");
  cls.def(
      "broadcast_variables",
      [](PyStrategy& s, nb::handle variables) {
        s.collective_on_tensors("broadcast_variables", variables, false, ReduceOp::kSum);
      },
      nb::arg("variables"),
      nb::sig("def broadcast_variables(self, variables: typing.Sequence[object]) -> None"),
      "Overwrites every array of ``variables`` on every worker with the chief's value, in "
      "place (one broadcast per bucket of bytes_per_pack). Collective. Arrays as "
      "Communicator.all_reduce takes them; errors name the element (``variables[2]``).");
  cls.def(
      "all_reduce_gradients",
      [](PyStrategy& s, nb::handle gradients, const ReduceOpArg& op) {
        s.collective_on_tensors("all_reduce_gradients", gradients, true, to_reduce_op(op));
      },
      nb::arg("gradients"), nb::arg("op") = "sum",
      nb::sig("def all_reduce_gradients(self, gradients: typing.Sequence[object], "
              "op: ReduceOp | str = 'sum') -> None"),
      "All-reduces ``gradients`` in place across workers: packed in order into buckets of at "
      "most bytes_per_pack bytes (a larger array alone), one all-reduce per bucket. ``op`` "
      "defaults to SUM, as TF's MultiWorkerMirroredStrategy sums the replicas' gradients; MEAN "
      "only for gradients of a per-shard mean loss. Every worker passes the same shapes and "
      "dtypes. Raises as Communicator.all_reduce, naming the element (``gradients[1]``).");
  cls.def(
      "begin_gradient_sync",
      [](PyStrategy& s, nb::handle gradients, const ReduceOpArg& op) {
        const ReduceOp rop = to_reduce_op(op);
        std::vector<Buffer> buffers;
        std::vector<TensorRef> refs;
        std::size_t i = 0;
        for (nb::handle t : gradients) {
          const std::string name = "gradients[" + std::to_string(i++) + "]";
          buffers.push_back(import_buffer(t, name.c_str(), true));
          refs.push_back(
              TensorRef{buffers.back().data, buffers.back().count, buffers.back().dtype});
        }
        MultiWorkerMirroredStrategy* st = &s.get();
        s.run("begin_gradient_sync", [st, &refs, rop] { st->begin_gradient_sync(refs, rop); });
        s.sync_buffers = std::move(buffers);  // begun: nothing of an earlier step is in flight
      },
      nb::arg("gradients"), nb::arg("op") = "sum",
      nb::sig("def begin_gradient_sync(self, gradients: typing.Sequence[object], "
              "op: ReduceOp | str = 'sum') -> None"),
      "Begins a gradient all-reduce overlapped with backprop (PyTorch DDP's Reducer, Horovod's "
      "allreduce_async): ``gradients`` in the order backprop makes them final (last layer "
      "first), packed into buckets as all_reduce_gradients packs them; each bucket is "
      "all-reduced on the communicator's progress thread as soon as :meth:`gradient_ready` "
      "marked all its arrays and every earlier bucket started, so every worker starts the same "
      "buckets in the same order. Do not touch an array of a started bucket until "
      ":meth:`finish_gradient_sync`. Holds the arrays until then. Every worker passes the same "
      "shapes, dtypes and ``op``. One step at a time.\n\n:raises InvalidUsage: a step already "
      "begun.\n:raises InvalidArgument: as all_reduce_gradients, naming the element.");
  cls.def(
      "gradient_ready",
      [](PyStrategy& s, std::size_t index) {
        MultiWorkerMirroredStrategy* st = &s.get();
        s.run("gradient_ready", [st, index] { st->gradient_ready(index); });
      },
      nb::arg("index"),
      "Array ``index`` of the begin_gradient_sync list is final (idempotent); may start its "
      "bucket's all-reduce, without waiting for it.\n\n:raises InvalidUsage: no step begun, "
      "index out of range.");
  cls.def(
      "finish_gradient_sync",
      [](PyStrategy& s) {
        MultiWorkerMirroredStrategy* st = &s.get();
        s.run("finish_gradient_sync", [st] { st->finish_gradient_sync(); });
        s.sync_buffers.clear();  // only now: a finish that never started leaves buckets running
      },
      "Marks the remaining arrays ready and waits for every bucket (each under the deadline); "
      "then the arrays hold the reduced values. Collective.\n\n:raises InvalidUsage: without "
      "begin_gradient_sync; a bucket's error (PeerError, TimeoutError, ...) after waiting for "
      "every bucket.");
  cls.def_prop_ro(
      "exposed_all_reduce_seconds",
      [](PyStrategy& s) { return s.get().exposed_all_reduce_seconds(); },
      "Seconds blocked waiting for gradient all-reduces: all of "
      "all_reduce_gradients and the waits inside finish_gradient_sync (the "
      "communication that compute did not hide).");
  bind_replicas(m, cls);
  cls.def(
      "finalize",
      [](PyStrategy& s) {
        MultiWorkerMirroredStrategy* st = &s.get();
        s.run("finalize", [st] { st->finalize(); });
      },
      "Orderly shutdown of the strategy's communicator: every worker calls it once after its "
      "last step (a barrier, then every peer is told). Later collectives raise InvalidUsage.");
}

}  // namespace mwms::python
