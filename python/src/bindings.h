// Declarations shared by the files of the _mwms extension (python/src). The extension sees only
// libmwms's public headers (include/mwms); each file binds one part of the API.
#pragma once

#include <nanobind/nanobind.h>

#include <atomic>
#include <string>
#include <variant>

#include "mwms/types.h"

namespace mwms::python {

namespace nb = nanobind;

// Note [python statics]: a value the extension looks up once in Python (a module, the main
// thread's ident) must not be a function-local static. Its initialiser runs under the GIL and
// an import inside it may release the GIL; a second thread (a local replica's, Note [python
// replicas]) then takes the GIL and waits on the static's guard while holding it, and the
// first never gets the GIL back: a deadlock at the first collective of a fresh process. So the
// value goes in an atomic, looked up without a guard: two threads may both look it up (imports
// are idempotent), and the first stored wins.

/// The object `lookup()` returns (a new reference), looked up once per process and kept for its
/// life (never released: it must outlive interpreter exit's exceptions; Note [python statics]).
/// With the GIL.
template <typename Lookup>
PyObject* cached_object(std::atomic<PyObject*>& slot, Lookup lookup) {
  PyObject* found = slot.load(std::memory_order_acquire);
  if (found != nullptr) return found;
  PyObject* made = lookup().release().ptr();
  if (!slot.compare_exchange_strong(found, made, std::memory_order_acq_rel)) {
    Py_DECREF(made);  // another thread stored it first (under the GIL: safe to release)
    return found;
  }
  return made;
}

/// A reduce op as Python passes it: a ReduceOp member or its name ("sum", "mean", ...).
using ReduceOpArg = std::variant<std::string, ReduceOp>;
/// The ReduceOp of `op`. @throws InvalidArgument (a ValueError in Python) for an unknown name.
ReduceOp to_reduce_op(const ReduceOpArg& op);

void bind_errors(nb::module_& m);        // errors.cc: the exception translator
void bind_cluster(nb::module_& m);       // cluster.cc: Cluster, resolve*()
void bind_communicator(nb::module_& m);  // communicator.cc: Communicator, Work, ReduceOp
void bind_strategy(nb::module_& m);      // strategy.cc: MultiWorkerMirroredStrategy

}  // namespace mwms::python
