// mwms.MultiWorkerMirroredStrategy.run() and mwms.ReplicaContext: local replicas from Python,
// over MultiWorkerMirroredStrategy::run() and ReplicaContext (include/mwms/strategy.h).
//
// Note [python replicas]: run(fn) releases the GIL and calls the C++ run(), which calls the body
// below on K threads (replica 0 on the calling thread, the others on the strategy's replica
// threads). Each body takes the GIL (PyGILState on a thread Python did not start), wraps its
// C++ ReplicaContext in a Python ReplicaContext, makes it the thread's current context
// (get_replica_context(), tf.distribute.get_replica_context()), calls fn(*args, **kwargs), keeps
// the result and retires the context: a retired context, or one used from another thread,
// raises InvalidUsage before it touches the strategy, which may be gone by then. The contexts
// stay alive until the C++ run() has returned: the buckets of an overlapped step that fn left
// unfinished hold their arrays, and run() drains them after every body has returned.
// - The GIL: every ReplicaContext collective releases it while it waits, since the other
//   replicas need it to reach the same collective (one that kept it would stall the K threads'
//   barrier until its deadline). The K bodies share the GIL, so their pure Python code runs one
//   at a time; NumPy's large operations release it.
// - Errors: a Python exception in fn leaves the body as nb::python_error; its text (with the
//   traceback) is formatted while the GIL is held, so that LocalReplicas can record it as the
//   root failure under its mutex without taking the GIL there. The other replicas' next
//   collective raises ReplicaError naming the failed replica, and run() re-raises the root (the
//   original exception and its traceback) once every body has returned.
// - Ctrl-C: replica 0 runs on the main thread, so KeyboardInterrupt reaches its Python code as
//   usual, and its collectives are interruptible as every blocking call is (Note [python
//   interrupts]); the others then fail with ReplicaError. An interrupted collective records its
//   own error (InvalidUsage: aborted) as the root before KeyboardInterrupt replaces it on
//   replica 0's way out, so run() raises a replica's KeyboardInterrupt in place of the root.
#include <nanobind/stl/string.h>
#include <nanobind/stl/variant.h>

#include <cstddef>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bindings.h"
#include "buffers.h"
#include "interrupt.h"
#include "mwms/errors.h"
#include "strategy.h"

namespace mwms::python {
namespace {

/// A ReplicaContext as Python sees it: valid on its replica's thread while fn runs.
class PyReplicaContext {
 public:
  PyReplicaContext(const ReplicaContext& ctx, PyStrategy* strategy)
      : ctx_(ctx), strategy_(strategy), thread_(std::this_thread::get_id()) {}

  const ReplicaContext& info() const { return ctx_; }
  void retire() { strategy_ = nullptr; }

  /// The C++ context for `op`, after checking that this is its run() call and its thread.
  const ReplicaContext& get(const char* op) const {
    if (strategy_ == nullptr) {
      throw InvalidUsage(std::string("ReplicaContext.") + op +
                         ": the run() call of local replica " +
                         std::to_string(ctx_.local_replica_id) +
                         " has returned; a ReplicaContext is valid only inside the replica "
                         "function it was made for");
    }
    if (std::this_thread::get_id() != thread_) {
      throw InvalidUsage(std::string("ReplicaContext.") + op +
                         ": called from another thread "
                         "than local replica " +
                         std::to_string(ctx_.local_replica_id) +
                         "'s; each replica uses only its own context");
    }
    return ctx_;
  }

  /// Runs a blocking call of this replica with the GIL released (interruptibly on the main
  /// thread, Note [python interrupts]).
  template <typename Call>
  void run(const char* op, Call&& call) {
    get(op);
    run_interruptibly(strategy_->get().communicator(), op, std::forward<Call>(call));
  }

  /// Imports `value` (an array, or a list or tuple of arrays) as the tensors of `op`.
  std::vector<TensorRef> import(nb::handle value, std::vector<Buffer>& buffers) const {
    std::vector<TensorRef> refs;
    const bool sequence = nb::isinstance<nb::list>(value) || nb::isinstance<nb::tuple>(value);
    if (!sequence) {
      buffers.push_back(import_buffer(value, "value", true));
    } else {
      std::size_t i = 0;
      for (nb::handle t : value) {
        const std::string name = "value[" + std::to_string(i++) + "]";
        buffers.push_back(import_buffer(t, name.c_str(), true));
      }
    }
    for (const Buffer& b : buffers) refs.push_back(TensorRef{b.data, b.count, b.dtype});
    return refs;
  }

  /// The arrays of the overlapped step in progress (held until finish_gradient_sync, or until
  /// this context dies after the C++ run() returned).
  std::vector<Buffer> sync_buffers;

 private:
  ReplicaContext ctx_;
  PyStrategy* strategy_;  // null once retired
  std::thread::id thread_;
};

/// This thread's current context (a borrowed reference, set while fn runs on it).
thread_local PyObject* t_current = nullptr;

/// Sets t_current for one body and restores the previous value.
class CurrentContext {
 public:
  explicit CurrentContext(PyObject* ctx) : previous_(t_current) { t_current = ctx; }
  ~CurrentContext() { t_current = previous_; }
  CurrentContext(const CurrentContext&) = delete;
  CurrentContext& operator=(const CurrentContext&) = delete;

 private:
  PyObject* previous_;
};

// run(fn, args, kwargs): Note [python replicas]. Under the GIL.
nb::object run_replicas(PyStrategy& s, const nb::callable& fn, const nb::tuple& args,
                        nb::handle kwargs) {
  if (!kwargs.is_none() && !nb::isinstance<nb::dict>(kwargs)) {
    throw nb::type_error("argument 'kwargs' must be a dict or None");
  }
  const int k = s.get().num_local_replicas();
  std::vector<nb::object> results(static_cast<std::size_t>(k));
  std::vector<nb::object> contexts(static_cast<std::size_t>(k));  // Note [python replicas]
  PyStrategy* strategy = &s;
  std::optional<nb::python_error> interrupt;  // Ctrl-C outranks the errors it caused
  const auto body = [&](const ReplicaContext& ctx) {
    nb::gil_scoped_acquire gil;
    const std::size_t id = static_cast<std::size_t>(ctx.local_replica_id);
    contexts[id] = nb::cast(PyReplicaContext(ctx, strategy), nb::rv_policy::move);
    PyReplicaContext& py_ctx = nb::cast<PyReplicaContext&>(contexts[id]);
    CurrentContext current(contexts[id].ptr());
    try {
      results[id] = kwargs.is_none() ? fn(*args) : fn(*args, **nb::borrow<nb::dict>(kwargs));
    } catch (nb::python_error& e) {
      py_ctx.retire();
      (void)e.what();  // formatted now, with the GIL
      if (e.matches(PyExc_KeyboardInterrupt) && !interrupt) interrupt.emplace(e);
      throw;
    }
    py_ctx.retire();
  };
  const bool outer = s.in_run;  // a nested run() is refused by the C++ run() below
  s.in_run = true;
  try {
    nb::gil_scoped_release nogil;
    s.get().run(body);
  } catch (...) {
    s.in_run = outer;
    if (interrupt) throw *interrupt;
    // A SIGINT that came while this thread waited for the replicas (not in a collective of
    // its own): KeyboardInterrupt now, not later inside the translation of the error.
    if (PyErr_CheckSignals() != 0) throw nb::python_error();
    throw;
  }
  s.in_run = outer;
  if (k == 1) return std::move(results[0]);  // TF: one replica's value, not a PerReplica
  nb::list out;
  for (nb::object& r : results) out.append(std::move(r));
  return nb::steal(PyList_AsTuple(out.ptr()));
}

// One number per local replica (a tuple or list of K from run()), or one per worker.
double reduce_value(PyStrategy& s, ReduceOp op, nb::handle value, ReduceOp& across) {
  across = op;
  const int k = s.get().num_local_replicas();
  if (!nb::isinstance<nb::list>(value) && !nb::isinstance<nb::tuple>(value)) {
    double x = 0;
    if (!nb::try_cast<double>(value, x)) {
      throw nb::type_error("argument 'value' is not a number or a sequence of numbers");
    }
    return x;
  }
  const std::size_t n = nb::len(value);
  if (n != static_cast<std::size_t>(k)) {
    throw InvalidArgument("argument 'value' has " + std::to_string(n) +
                          " values; expected one per local replica (" + std::to_string(k) +
                          ", as run() returns them) or one number");
  }
  double folded = 0;
  std::size_t i = 0;
  for (nb::handle v : value) {
    double x = 0;
    if (!nb::try_cast<double>(v, x)) {
      throw nb::type_error(("argument 'value[" + std::to_string(i) + "]' is not a number").c_str());
    }
    if (i++ == 0) {
      folded = x;
    } else if (op == ReduceOp::kSum || op == ReduceOp::kMean) {
      folded += x;
    } else if (op == ReduceOp::kMin) {
      folded = x < folded ? x : folded;
    } else if (op == ReduceOp::kMax) {
      folded = x > folded ? x : folded;
    } else {
      folded *= x;
    }
  }
  if (op == ReduceOp::kMean) across = ReduceOp::kSum;  // divided by every replica below
  return folded;
}

}  // namespace

void bind_replicas(nb::module_& m, nb::class_<PyStrategy>& strategy) {
  nb::class_<PyReplicaContext> ctx(
      m, "ReplicaContext",
      "What a replica function sees (tf.distribute.ReplicaContext; C++ "
      "``mwms::ReplicaContext``): :meth:`MultiWorkerMirroredStrategy.run` makes one per local "
      "replica, and :func:`get_replica_context` returns it inside the replica function. Its "
      "collectives work only there, on that replica's thread (else InvalidUsage); its ids and "
      "batch_shard stay readable. Its collectives are "
      "collectives across every replica of every worker: each local replica calls them in the "
      "same order with the same shapes, each with its OWN arrays. They release the GIL while "
      "they wait; each wait has the strategy's deadline. Not constructible from Python.");
  ctx.def_prop_ro(
         "replica_id_in_sync_group",
         [](PyReplicaContext& c) { return c.info().replica_id_in_sync_group; },
         "Global replica id: worker_index * num_local_replicas + local_replica_id.")
      .def_prop_ro(
          "num_replicas_in_sync", [](PyReplicaContext& c) { return c.info().num_replicas_in_sync; },
          "Replicas across all workers (workers x K).")
      .def_prop_ro(
          "local_replica_id", [](PyReplicaContext& c) { return c.info().local_replica_id; },
          "This replica on its worker, in [0, K).")
      .def_prop_ro(
          "num_local_replicas", [](PyReplicaContext& c) { return c.info().num_local_replicas; },
          "K, the local replicas of each worker.");
  ctx.def(
      "all_reduce",
      [](PyReplicaContext& c, const ReduceOpArg& op, nb::object value) {
        const ReplicaContext& rc = c.get("all_reduce");
        const ReduceOp rop = to_reduce_op(op);
        std::vector<Buffer> buffers;  // held while the call runs
        std::vector<TensorRef> refs = c.import(value, buffers);
        c.run("all_reduce", [&rc, rop, &refs] { rc.all_reduce(rop, refs); });
        return value;
      },
      nb::arg("reduce_op"), nb::arg("value"),
      nb::sig("def all_reduce(self, reduce_op: ReduceOp | str, value: object) -> object"),
      "Reduces ``value`` (an array, or a list or tuple of arrays) in place across all "
      "num_replicas_in_sync replicas (tf.distribute.ReplicaContext.all_reduce, argument order "
      "included) and returns it: afterwards every replica's arrays hold ``reduce_op`` over "
      "every replica's values (MEAN: the sum divided by num_replicas_in_sync, once). The local "
      "replicas are combined in replica order, so the bits do not depend on thread timing. "
      "Arrays as Communicator.all_reduce takes them; every replica passes the same shapes and "
      "dtypes.\n\n:raises InvalidArgument: shapes differing between replicas (naming the replica "
      "and array), and as Communicator.all_reduce.\n:raises ReplicaError: another local replica "
      "failed or returned without making this call.\n:raises TimeoutError: a local replica did "
      "not arrive in time (naming it).");
  ctx.def(
      "broadcast_variables",
      [](PyReplicaContext& c, nb::object variables) {
        const ReplicaContext& rc = c.get("broadcast_variables");
        std::vector<Buffer> buffers;
        std::vector<TensorRef> refs = c.import(variables, buffers);
        c.run("broadcast_variables", [&rc, &refs] { rc.broadcast_variables(refs); });
      },
      nb::arg("variables"), nb::sig("def broadcast_variables(self, variables: object) -> None"),
      "Overwrites ``variables`` (this replica's own copy: an array, or a list or tuple of "
      "arrays) with the chief's local replica 0 value, in place. Collective across every "
      "replica; raises as all_reduce.");
  ctx.def(
      "batch_shard",
      [](PyReplicaContext& c, std::size_t global_batch_size) {
        Shard shard = c.info().batch_shard(global_batch_size);
        return nb::slice(nb::int_(shard.begin), nb::int_(shard.end), nb::none());
      },
      nb::arg("global_batch_size"),
      nb::sig("def batch_shard(self, global_batch_size: int) -> slice"),
      "This replica's rows of a global batch, as a slice: the replica_id_in_sync_group-th of "
      "num_replicas_in_sync contiguous parts whose sizes differ by at most one. Does not block.");
  ctx.def(
      "begin_gradient_sync",
      [](PyReplicaContext& c, nb::object gradients, const ReduceOpArg& op) {
        const ReplicaContext& rc = c.get("begin_gradient_sync");
        const ReduceOp rop = to_reduce_op(op);
        std::vector<Buffer> buffers;
        std::vector<TensorRef> refs = c.import(gradients, buffers);
        c.run("begin_gradient_sync", [&rc, rop, &refs] { rc.begin_gradient_sync(refs, rop); });
        c.sync_buffers = std::move(buffers);  // begun: nothing of an earlier step is in flight
      },
      nb::arg("gradients"), nb::arg("op") = "sum",
      nb::sig("def begin_gradient_sync(self, gradients: object, op: ReduceOp | str = 'sum') "
              "-> None"),
      "Begins this replica's overlapped gradient sync: ``gradients`` (its own arrays, in the "
      "order backprop makes them final) are reduced across every replica bucket by bucket, each "
      "bucket as soon as every local replica marked it ready (:meth:`gradient_ready`) and every "
      "earlier bucket started; :meth:`finish_gradient_sync` waits for all. Collective across "
      "the local replicas (the same shapes, dtypes and ``op`` on each); all three calls inside "
      "the same run(). Do not touch an array marked ready until finish. Holds the arrays until "
      "then.\n\n:raises InvalidUsage: a step already begun (begin_gradient_sync called "
      "again).\n:raises InvalidArgument: shapes or "
      "op differing from replica 0's.");
  ctx.def(
      "gradient_ready",
      [](PyReplicaContext& c, std::size_t index) {
        const ReplicaContext& rc = c.get("gradient_ready");
        c.run("gradient_ready", [&rc, index] { rc.gradient_ready(index); });
      },
      nb::arg("index"),
      "Array ``index`` of this replica's begin_gradient_sync list is final (idempotent); may "
      "reduce its bucket across the local replicas and start its all-reduce, without waiting "
      "for it.\n\n:raises InvalidUsage: no step begun, index out of range.");
  ctx.def(
      "finish_gradient_sync",
      [](PyReplicaContext& c) {
        const ReplicaContext& rc = c.get("finish_gradient_sync");
        c.run("finish_gradient_sync", [&rc] { rc.finish_gradient_sync(); });
        // Only now: a finish that failed early leaves buckets in flight until run() drains them.
        c.sync_buffers.clear();
      },
      "Marks the remaining arrays ready and waits for every bucket: then every replica's "
      "arrays hold op over all replicas' values. Collective across the local replicas.\n\n"
      ":raises InvalidUsage: without begin_gradient_sync.\n:raises ReplicaError: another local "
      "replica failed.");

  m.def(
      "get_replica_context",
      []() -> nb::object {
        if (t_current == nullptr) return nb::none();
        return nb::borrow(t_current);
      },
      nb::sig("def get_replica_context() -> ReplicaContext | None"),
      "The ReplicaContext of the replica function running on this thread "
      "(tf.distribute.get_replica_context()), or None outside "
      ":meth:`MultiWorkerMirroredStrategy.run`. Does not block.");

  strategy.def(
      "run",
      [](PyStrategy& s, const nb::callable& fn, const nb::tuple& args, nb::handle kwargs) {
        return run_replicas(s, fn, args, kwargs);
      },
      nb::arg("fn"), nb::arg("args") = nb::tuple(), nb::arg("kwargs") = nb::none(),
      nb::sig("def run(self, fn: typing.Callable[..., object], args: tuple = (), "
              "kwargs: dict | None = None) -> object"),
      "Calls ``fn(*args, **kwargs)`` once per local replica (tf.distribute.Strategy.run) and "
      "returns when every call has returned. Inside, :func:`get_replica_context` is that "
      "replica's :class:`ReplicaContext`. K = 1: one call on this thread, and its return value "
      "is returned. K > 1: K calls at once, replica 0 on this thread and the others on the "
      "strategy's threads, sharing the GIL (so ``fn`` must be safe to run concurrently, each "
      "replica touching its own copy of the model); returns a tuple of the K return values in "
      "local-replica order (TF's PerReplica; see :meth:`experimental_local_results`). Not "
      "collective by itself.\n\n:raises: the first failed replica's own exception (the others "
      "then stop in their next collective with ReplicaError), after every call has returned; "
      "InvalidUsage when called from inside run(), or when a replica returned while the others "
      "waited for it in a collective.");
  strategy.def(
      "experimental_local_results",
      [](PyStrategy& s, nb::handle value) -> nb::tuple {
        if (s.get().num_local_replicas() > 1 && nb::isinstance<nb::tuple>(value)) {
          return nb::borrow<nb::tuple>(value);
        }
        return nb::make_tuple(value);
      },
      nb::arg("value"),
      "The per-replica values of a run() result as a tuple in local-replica order "
      "(tf.distribute.Strategy.experimental_local_results): run()'s tuple itself with K > 1, "
      "else ``(value,)``.");
  strategy.def(
      "reduce",
      [](PyStrategy& s, const ReduceOpArg& op, nb::handle value) {
        const ReduceOp rop = to_reduce_op(op);
        ReduceOp across = rop;
        const bool per_replica =
            nb::isinstance<nb::list>(value) || nb::isinstance<nb::tuple>(value);
        double local = reduce_value(s, rop, value, across);
        MultiWorkerMirroredStrategy* st = &s.get();
        double result = 0;
        s.run("reduce", [&] { result = st->reduce(across, local); });
        if (per_replica && rop == ReduceOp::kMean) result /= st->num_replicas_in_sync();
        return result;
      },
      nb::arg("op"), nb::arg("value"),
      nb::sig("def reduce(self, op: ReduceOp | str, value: float | typing.Sequence[float]) "
              "-> float"),
      "Reduces a number across workers (tf.distribute.Strategy.reduce; float64) and returns the "
      "same result on every worker. ``value`` is one number per worker, or one per local "
      "replica (the tuple run() returns: combined here, then across workers, so MEAN is over "
      "all num_replicas_in_sync values). Collective.\n\n:raises InvalidArgument: a sequence "
      "whose length is not num_local_replicas.");
}

}  // namespace mwms::python
