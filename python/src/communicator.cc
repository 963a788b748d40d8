// mwms.Communicator, mwms.Work and mwms.ReduceOp over include/mwms/communicator.h. Blocking
// collectives run on the calling thread with the GIL released, interruptibly (Note [python
// interrupts]); the *_async ones return the C++ Work; buffers are imported in place (Note [python
// buffers]).
#include "communicator.h"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/variant.h>

#include <utility>

#include "mwms/errors.h"

namespace mwms::python {

ReduceOp to_reduce_op(const ReduceOpArg& op) {
  if (const auto* name = std::get_if<std::string>(&op)) return parse_reduce_op(*name);
  return std::get<ReduceOp>(op);
}

PyCommunicator::PyCommunicator(const ResolvedCluster& cluster,
                               const CommunicatorOptions& options) {
  // The Job owns what it builds: after an interrupt it finishes (or fails) on its own thread and
  // destroys the communicator there.
  auto built = std::make_shared<std::unique_ptr<Communicator>>();
  Job::run([built, cluster, options] { *built = Communicator::create(cluster, options); });
  comm_ = std::move(*built);
}

PyCommunicator::~PyCommunicator() {
  {
    nb::gil_scoped_release nogil;
    comm_.reset();
  }
  pending_.clear();
}

std::shared_ptr<Work> PyCommunicator::track(std::shared_ptr<Work> work,
                                            std::vector<Buffer> buffers) {
  prune();
  pending_.push_back(PendingWork{work, std::move(buffers)});
  return work;
}

void PyCommunicator::prune() {
  std::size_t kept = 0;
  for (std::size_t i = 0; i < pending_.size(); ++i) {
    if (!pending_[i].work->test()) pending_[kept++] = std::move(pending_[i]);
  }
  pending_.resize(kept);
}

void PyCommunicator::wait(Work& work, const char* op, std::optional<double> timeout_seconds) {
  run_interruptibly(*comm_, op, [&] { work.wait(timeout_seconds); });
  prune();
}

void PyCommunicator::finalize() {
  prune();
  run_interruptibly(*comm_, "finalize", [this] { comm_->finalize(); });
  prune();
}

namespace {

// mwms.Work: the handle of an asynchronous collective. It keeps the Python communicator alive
// (whose pending list keeps the buffers alive until the collective completed).
class PyWork {
 public:
  PyWork(std::shared_ptr<Work> work, nb::object owner, const char* op)
      : work_(std::move(work)), owner_(std::move(owner)), op_(op) {}

  bool test() { return work_->test(); }

  void wait(std::optional<double> timeout_seconds) {
    nb::inst_ptr<PyCommunicator>(owner_)->wait(*work_, op_, timeout_seconds);
  }

  std::string repr() {
    return std::string("<mwms.Work ") + op_ + (work_->test() ? " completed>" : " running>");
  }

 private:
  std::shared_ptr<Work> work_;
  nb::object owner_;
  const char* op_;
};

std::optional<TransportChoice> to_transport(const std::optional<std::string>& name) {
  if (!name) return std::nullopt;  // MWMS_TRANSPORT
  if (*name == "auto") return TransportChoice::kAuto;
  if (*name == "tcp") return TransportChoice::kTcp;
  if (*name == "shm") return TransportChoice::kShm;
  if (*name == "mpi") return TransportChoice::kMpi;
  throw InvalidArgument("argument 'transport' is '" + *name +
                        "'; expected 'auto', 'tcp', 'shm', 'mpi' or None (MWMS_TRANSPORT)");
}

void check_same_dtype(const Buffer& send, const Buffer& recv, const char* op) {
  if (send.dtype != recv.dtype) {
    throw nb::type_error((std::string(op) + ": argument 'recv' has dtype " +
                          std::string(to_string(recv.dtype)) + " but argument 'send' has " +
                          std::string(to_string(send.dtype)))
                             .c_str());
  }
}

void check_count(const Buffer& big, const char* big_name, const Buffer& small,
                 const char* small_name, int world, const char* op) {
  if (big.count != small.count * static_cast<std::size_t>(world)) {
    throw InvalidArgument(std::string(op) + ": argument '" + big_name + "' has " +
                          std::to_string(big.count) + " elements but needs world_size (" +
                          std::to_string(world) + ") x the " + std::to_string(small.count) +
                          " elements of argument '" + small_name + "' = " +
                          std::to_string(small.count * static_cast<std::size_t>(world)));
  }
}

// Each collective: imports and checks its arguments, then either runs it on the calling thread
// with the GIL released, interruptibly (`direct`: the blocking form; returns null), or starts it
// and returns its Work, tracked with its buffers.
using Self = PyCommunicator;

std::shared_ptr<Work> all_reduce_call(Self& self, bool direct, nb::handle tensor,
                                      const ReduceOpArg& op) {
  Buffer b = import_buffer(tensor, "tensor", true);
  ReduceOp rop = to_reduce_op(op);
  if (direct) {
    run_interruptibly(self.comm(), "all_reduce",
                      [&] { self.comm().all_reduce(b.data, b.count, b.dtype, rop); });
    return nullptr;
  }
  auto work = self.comm().all_reduce_async(b.data, b.count, b.dtype, rop);
  return self.track(std::move(work), {std::move(b)});
}

std::shared_ptr<Work> reduce_scatter_call(Self& self, bool direct, nb::handle send,
                                          nb::handle recv, const ReduceOpArg& op) {
  Buffer s = import_buffer(send, "send", false);
  Buffer r = import_buffer(recv, "recv", true);
  check_same_dtype(s, r, "reduce_scatter");
  check_count(s, "send", r, "recv", self.comm().world_size(), "reduce_scatter");
  ReduceOp rop = to_reduce_op(op);
  if (direct) {
    run_interruptibly(self.comm(), "reduce_scatter", [&] {
      self.comm().reduce_scatter(s.data, r.data, r.count, r.dtype, rop);
    });
    return nullptr;
  }
  auto work = self.comm().reduce_scatter_async(s.data, r.data, r.count, r.dtype, rop);
  return self.track(std::move(work), {std::move(s), std::move(r)});
}

std::shared_ptr<Work> all_gather_call(Self& self, bool direct, nb::handle send,
                                      nb::handle recv) {
  Buffer s = import_buffer(send, "send", false);
  Buffer r = import_buffer(recv, "recv", true);
  check_same_dtype(s, r, "all_gather");
  check_count(r, "recv", s, "send", self.comm().world_size(), "all_gather");
  if (direct) {
    run_interruptibly(self.comm(), "all_gather",
                      [&] { self.comm().all_gather(s.data, r.data, s.count, s.dtype); });
    return nullptr;
  }
  auto work = self.comm().all_gather_async(s.data, r.data, s.count, s.dtype);
  return self.track(std::move(work), {std::move(s), std::move(r)});
}

std::shared_ptr<Work> broadcast_call(Self& self, bool direct, nb::handle tensor, int root) {
  Buffer b = import_buffer(tensor, "tensor", true);
  if (direct) {
    run_interruptibly(self.comm(), "broadcast",
                      [&] { self.comm().broadcast(b.data, b.count, b.dtype, root); });
    return nullptr;
  }
  auto work = self.comm().broadcast_async(b.data, b.count, b.dtype, root);
  return self.track(std::move(work), {std::move(b)});
}

std::shared_ptr<Work> barrier_call(Self& self, bool direct) {
  if (direct) {
    run_interruptibly(self.comm(), "barrier", [&] { self.comm().barrier(); });
    return nullptr;
  }
  return self.track(self.comm().barrier_async(), {});
}

// Binds NAME (blocking) and NAME_async.
template <typename... Args, typename... Extra>
void def_collective(nb::class_<PyCommunicator>& cls, const char* name,
                    std::shared_ptr<Work> (*call)(Self&, bool, Args...), const char* doc,
                    const char* async_doc, const Extra&... extra) {
  cls.def(
      name,
      [call](Self& self, Args... args) { call(self, /*direct=*/true, args...); },
      extra..., doc);
  const std::string async_name = std::string(name) + "_async";
  cls.def(
      async_name.c_str(),
      [call, name](Self& self, Args... args) {
        auto work = call(self, false, args...);
        return PyWork(std::move(work), nb::find(&self), name);
      },
      extra..., async_doc);
}

}  // namespace

void bind_communicator(nb::module_& m) {
  nb::enum_<ReduceOp>(m, "ReduceOp",
                      "Reduction operator (tf.distribute.ReduceOp, ncclRedOp_t). Wherever an op "
                      "is taken, its lower-case name (``'sum'``, ``'mean'``, ...) works too.")
      .value("SUM", ReduceOp::kSum, "Sum.")
      .value("MEAN", ReduceOp::kMean,
             "Sum divided by the world size (truncating for integer dtypes, as in C++).")
      .value("MIN", ReduceOp::kMin, "Element-wise minimum.")
      .value("MAX", ReduceOp::kMax, "Element-wise maximum.")
      .value("PROD", ReduceOp::kProd, "Product.");

  nb::class_<PyWork>(m, "Work",
                     "Handle of an asynchronous collective (c10d's Work), returned by the "
                     "``*_async`` methods. Dropping it does not cancel the collective; its "
                     "buffers stay referenced by the communicator until it has completed, and "
                     "must not be touched meanwhile. The reference keeps their memory alive "
                     "against everything that checks references, but not against NumPy's "
                     "``a.resize(..., refcheck=False)`` and ``a.__setstate__(...)``, which free "
                     "an array's memory unchecked: the collective would then read and write "
                     "freed memory (a crash or corrupted data). Wait first, or reduce a copy.")
      .def("test", &PyWork::test,
           "True once the collective has completed on this rank, successfully or not. Never "
           "blocks, never raises.")
      .def("wait", &PyWork::wait, nb::arg("timeout_seconds") = nb::none(),
           "Blocks (GIL released; Ctrl-C interrupts it, aborting the communicator) until the "
           "collective completed and raises its error (TimeoutError, PeerError, "
           "CollectiveMismatchError, InvalidUsage, ...). With ``timeout_seconds``, raises "
           "TimeoutError when it has not completed by then (the collective keeps running under "
           "its own deadline).")
      .def("__repr__", &PyWork::repr);

  nb::class_<PyCommunicator> cls(
      m, "Communicator",
      "A ring of ranks and its collectives (C++ ``mwms::Communicator``).\n\n"
      "Every rank calls the same collectives in the same order with matching sizes, dtypes, "
      "ops and roots; a mismatch raises CollectiveMismatchError instead of corrupting memory. "
      "Buffers are NumPy arrays (or anything exporting DLPack or the buffer protocol) in host "
      "memory, C-contiguous, of float32, float64, float16, bfloat16 (ml_dtypes), int32 or "
      "int64; they are used in place, never copied. Blocking calls release the GIL, and Ctrl-C "
      "interrupts them within about 0.1 s: the communicator is then aborted (peers fail with a "
      "PeerError naming this rank) and every later call raises InvalidUsage. One thread at a "
      "time per communicator. Use it as a context manager to finalize on exit (or abort when "
      "the block raises).");
  cls.def(
      "__init__",
      [](Self* self, std::optional<ResolvedCluster> cluster, std::optional<double> timeout_seconds,
         std::optional<double> connect_timeout_seconds, std::optional<std::string> transport,
         std::optional<std::string> algorithm, std::optional<std::size_t> chunk_bytes,
         std::optional<long long> small_message_bytes) {
        CommunicatorOptions o;  // None: unset (Note [option sentinels], mwms/options.h)
        o.timeout_seconds = timeout_seconds;
        o.connect_timeout_seconds = connect_timeout_seconds;
        o.transport = to_transport(transport);
        o.algorithm = algorithm;
        o.chunk_bytes = chunk_bytes;
        o.small_message_bytes = small_message_bytes;
        new (self) PyCommunicator(cluster ? *cluster : resolve_from_environment(), o);
      },
      nb::arg("cluster") = nb::none(), nb::kw_only(), nb::arg("timeout_seconds") = nb::none(),
      nb::arg("connect_timeout_seconds") = nb::none(), nb::arg("transport") = nb::none(),
      nb::arg("algorithm") = nb::none(), nb::arg("chunk_bytes") = nb::none(),
      nb::arg("small_message_bytes") = nb::none(),
      "Forms the ring of ``cluster`` (default: :func:`resolve`): rendezvous with every task and "
      "a link to every peer (shared memory on one host, TCP between hosts). Blocks until every "
      "rank has connected or ``connect_timeout_seconds`` (None: MWMS_CONNECT_TIMEOUT_SECONDS, "
      "60) passed. ``timeout_seconds`` (None: MWMS_TIMEOUT_SECONDS, 300) is the deadline of "
      "every collective; ``transport`` is ``'auto'``, ``'tcp'``, ``'shm'``, ``'mpi'`` or None "
      "(MWMS_TRANSPORT); ``algorithm`` forces ``'ring'``, ``'rd'``, ``'rhd'``, ``'gather'`` "
      "(None: MWMS_ALGO); ``chunk_bytes`` (None: MWMS_CHUNK_BYTES) and ``small_message_bytes`` "
      "(None: MWMS_SMALL_MESSAGE_BYTES) as in C++ CommunicatorOptions. Every None is the only "
      "'not set' (the old 0, -1 and '' still mean None for one release, deprecated). "
      "Interruptible by Ctrl-C.\n\n"
      ":raises BootstrapError: a peer never came up, a port in use, differing cluster views.");
  cls.def_prop_ro("rank", [](Self& s) { return s.comm().rank(); },
                  "This process's rank, in [0, world_size).")
      .def_prop_ro("world_size", [](Self& s) { return s.comm().world_size(); },
                   "Number of ranks in the ring.")
      .def_prop_ro("seq", [](Self& s) { return s.comm().seq(); },
                   "Number of collectives started so far (the next one's sequence number).")
      .def_prop_ro("cluster", [](Self& s) { return s.comm().cluster(); },
                   "The cluster this communicator was formed from.")
      .def("describe", [](Self& s) { return s.comm().describe(); },
           "One line naming the backend and the transports of the links.");

  def_collective(
      cls, "all_reduce", &all_reduce_call,
      "In-place all-reduce of ``tensor`` across every rank with ``op`` (default sum). Any size, "
      "0 included. float16/bfloat16 are reduced in float32 and rounded once per step.\n\n"
      ":raises TypeError: not an array, or an unsupported dtype.\n"
      ":raises InvalidArgument: read-only, not C-contiguous, not in host memory.\n"
      ":raises TimeoutError, PeerError, CollectiveMismatchError: the collective failed (the "
      "communicator is then poisoned).\n:raises InvalidUsage: poisoned, aborted or finalized.",
      "all_reduce() without waiting: returns a :class:`Work`. Argument errors are raised at "
      "once, the collective's own from Work.wait(). Until it completed, ``tensor`` must not be "
      "touched; never ``resize(refcheck=False)`` or ``__setstate__`` it (see :class:`Work`).",
      nb::arg("tensor"), nb::arg("op") = "sum");
  def_collective(
      cls, "reduce_scatter", &reduce_scatter_call,
      "Reduce-scatter (NCCL semantics): ``send`` holds world_size x recv.size elements; rank r "
      "receives into ``recv`` the reduction of block r. Same dtype for both. Raises as "
      "all_reduce, and InvalidArgument when the sizes do not match.",
      "reduce_scatter() without waiting: returns a :class:`Work`; its buffers must not be "
      "touched until it completed (see :class:`Work`).", nb::arg("send"),
      nb::arg("recv"), nb::arg("op") = "sum");
  def_collective(
      cls, "all_gather", &all_gather_call,
      "All-gather (NCCL semantics): ``recv`` (world_size x send.size elements) receives every "
      "rank's ``send``, rank r's at offset r x send.size. Raises as reduce_scatter.",
      "all_gather() without waiting: returns a :class:`Work`; its buffers must not be "
      "touched until it completed (see :class:`Work`).", nb::arg("send"),
      nb::arg("recv"));
  def_collective(
      cls, "broadcast", &broadcast_call,
      "Overwrites ``tensor`` on every rank with rank ``root``'s. Raises as all_reduce, and "
      "InvalidArgument for a root outside [0, world_size).",
      "broadcast() without waiting: returns a :class:`Work`; its buffers must not be "
      "touched until it completed (see :class:`Work`).", nb::arg("tensor"),
      nb::arg("root") = 0);
  def_collective(cls, "barrier", &barrier_call,
                 "Returns once every rank has entered the barrier. Raises as all_reduce.",
                 "barrier() without waiting: returns a :class:`Work`.");

  cls.def("finalize", &PyCommunicator::finalize,
          "Orderly shutdown, collective: every rank calls it after its last collective. Waits for "
          "outstanding asynchronous collectives, runs a barrier, tells every peer and closes the "
          "links, so that a rank exiting next is not mistaken for a dead one. Later collectives "
          "raise InvalidUsage; a second call does nothing. Interruptible like every blocking "
          "call.")
      .def("abort", [](Self& s, const std::string& reason) { s.comm().abort(reason); },
           nb::arg("reason"),
           "Poisons this communicator and tells every peer (best effort, never raises): peers "
           "blocked in a collective fail with PeerError naming this rank and ``reason``.")
      .def("__enter__", [](nb::handle self) { return nb::borrow(self); },
           nb::sig("def __enter__(self) -> Communicator"), "Returns the communicator itself.")
      .def(
          "__exit__",
          [](Self& s, nb::handle type, nb::handle, nb::handle) {
            if (type.is_none()) {
              s.finalize();
            } else {
              s.comm().abort(std::string(nb::type_name(type).c_str()) +
                             " raised in the with block of rank " +
                             std::to_string(s.comm().rank()));
            }
            return false;
          },
          nb::arg("exc_type").none(), nb::arg("exc_value").none(), nb::arg("traceback").none(),
          "Finalizes on a normal exit; aborts (peers fail at once, naming this rank) when the "
          "block raised. The exception is not suppressed.");
}

}  // namespace mwms::python
