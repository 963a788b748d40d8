// mwms.MultiWorkerMirroredStrategy over include/mwms/strategy.h. Its blocking calls run on the
// calling thread with the GIL released; Ctrl-C aborts the strategy's communicator (Note [python
// interrupts]).
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

class PyStrategy {
 public:
  PyStrategy(const ResolvedCluster& cluster, const CommunicationOptions& options) {
    // On a Job (the rendezvous has nothing to abort yet), which owns what it builds.
    auto built = std::make_shared<std::unique_ptr<MultiWorkerMirroredStrategy>>();
    Job::run([built, cluster, options] {
      *built = std::make_unique<MultiWorkerMirroredStrategy>(cluster, options);
    });
    strategy_ = std::move(*built);
  }

  ~PyStrategy() {
    nb::gil_scoped_release nogil;
    strategy_.reset();
  }

  MultiWorkerMirroredStrategy& get() { return *strategy_; }

  // Runs a blocking call on the calling thread, interruptibly (Note [python interrupts]).
  void run(const char* op, const std::function<void()>& call) {
    run_interruptibly(strategy_->communicator(), op, call);
  }

  void collective_on_tensors(const char* op, nb::handle tensors, bool gradients, ReduceOp rop) {
    std::vector<Buffer> buffers;  // hold the imports while the call runs
    std::vector<TensorRef> refs;
    std::size_t i = 0;
    for (nb::handle t : tensors) {
      const std::string name =
          (gradients ? "gradients[" : "variables[") + std::to_string(i++) + "]";
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

 private:
  std::unique_ptr<MultiWorkerMirroredStrategy> strategy_;
};

}  // namespace

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
      "strategy's communicator). One thread at a time. One local replica per worker (local "
      "replicas are not bound in Python yet).");
  cls.def(
      "__init__",
      [](PyStrategy* self, std::optional<ResolvedCluster> cluster,
         const std::string& implementation, std::optional<std::size_t> bytes_per_pack,
         std::optional<double> timeout_seconds, const std::string& compression) {
        CommunicationOptions o;  // None: unset (Note [option sentinels], mwms/options.h)
        o.implementation = to_implementation(implementation);
        o.bytes_per_pack = bytes_per_pack;
        o.timeout_seconds = timeout_seconds;
        o.compression = to_compression(compression);
        new (self) PyStrategy(cluster ? *cluster : resolve_from_environment(), o);
      },
      nb::arg("cluster") = nb::none(), nb::kw_only(), nb::arg("implementation") = "auto",
      nb::arg("bytes_per_pack") = nb::none(), nb::arg("timeout_seconds") = nb::none(),
      nb::arg("compression") = "none",
      "Resolves the cluster (default: :func:`resolve`) and forms the ring; blocks until every "
      "worker has connected. Options as tf.distribute.experimental.CommunicationOptions: "
      "``implementation`` (``'auto'``, ``'ring'``; ``'nccl'`` needs GPU buffers, not bound), "
      "``bytes_per_pack`` (None: MWMS_BYTES_PER_PACK, 4 MiB), ``timeout_seconds`` (None: "
      "MWMS_TIMEOUT_SECONDS; 0 still means None, deprecated), ``compression`` of float32 "
      "gradients on the wire (``'none'``, ``'fp16'``, ``'bf16'``).\n\n:raises BootstrapError: as "
      "Communicator().");
  cls.def_prop_ro("num_replicas_in_sync",
                  [](PyStrategy& s) { return s.get().num_replicas_in_sync(); },
                  "Replicas across all workers (one per worker).")
      .def_prop_ro("num_workers", [](PyStrategy& s) { return s.get().num_workers(); },
                   "Number of workers in the ring.")
      .def_prop_ro("worker_index", [](PyStrategy& s) { return s.get().worker_index(); },
                   "This worker's rank (TF task id).")
      .def_prop_ro("is_chief", [](PyStrategy& s) { return s.get().is_chief(); },
                   "True on the leader (chief, or worker 0 without a chief): checkpoints, logs.")
      .def_prop_ro("cluster", [](PyStrategy& s) { return s.get().cluster(); },
                   "The resolved cluster.")
      .def_prop_ro("bytes_per_pack",
                   [](PyStrategy& s) { return *s.get().options().bytes_per_pack; },
                   "Bucket size in effect, in bytes.")
      .def_prop_ro("timeout_seconds",
                   [](PyStrategy& s) { return *s.get().options().timeout_seconds; },
                   "Deadline in effect for every collective, in seconds.")
      .def_prop_ro("all_reduce_seconds",
                   [](PyStrategy& s) { return s.get().all_reduce_seconds(); },
                   "Seconds spent in all_reduce_gradients so far (wall clock).")
      .def_prop_ro("all_reduce_bytes", [](PyStrategy& s) { return s.get().all_reduce_bytes(); },
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
      "one (the first global_batch_size % num_workers workers get one more). "
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
      "reduce",
      [](PyStrategy& s, const ReduceOpArg& op, double value) {
        ReduceOp rop = to_reduce_op(op);
        MultiWorkerMirroredStrategy* st = &s.get();
        double result = 0;
        s.run("reduce", [&] { result = st->reduce(rop, value); });
        return result;
      },
      nb::arg("op"), nb::arg("value"),
      "Reduces one number across workers (tf.distribute.Strategy.reduce of a per-replica "
      "scalar, as float64); every worker gets the same result. Collective.");
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
