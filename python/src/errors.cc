// Note [python errors]: every mwms::Error leaving the extension is translated here, once, into
// the class of the same name in mwms/_errors.py, with the C++ ErrorContext's fields as attributes
// (None when unset). The classes live in Python so that they carry docstrings and multiple bases
// (InvalidArgument is a ValueError, TimeoutError a builtin TimeoutError).
#include "mwms/errors.h"

#include <nanobind/stl/string.h>

#include <atomic>
#include <exception>

#include "bindings.h"

namespace mwms::python {
namespace {

// The mwms._errors module, imported at the first translation and kept for the process's life
// (never released: it must outlive every exception, including those raised at interpreter exit;
// Note [python statics]).
std::atomic<PyObject*> g_errors_module{nullptr};
PyObject* errors_module() {
  return cached_object(g_errors_module, [] { return nb::module_::import_("mwms._errors"); });
}

void set_int(nb::dict& kw, const char* key, long long value) {
  if (value >= 0) kw[key] = value;
}
void set_str(nb::dict& kw, const char* key, const std::string& value) {
  if (!value.empty()) kw[key] = value;
}
void set_float(nb::dict& kw, const char* key, double value) {
  if (value >= 0) kw[key] = value;
}

// Raises mwms._errors.<class_name>(e.what(), e.message(), **context) as the pending exception.
void raise(const Error& e, const char* class_name, nb::dict extra = nb::dict()) {
  const ErrorContext& c = e.context();
  nb::dict kw;
  set_int(kw, "rank", c.rank);
  set_int(kw, "world_size", c.world_size);
  set_str(kw, "task", c.task);
  set_int(kw, "peer_rank", c.peer_rank);
  set_str(kw, "peer_address", c.peer_address);
  set_str(kw, "peer_task", c.peer_task);
  set_str(kw, "op", c.op);
  set_int(kw, "seq", c.seq);
  set_str(kw, "transport", c.transport);
  set_int(kw, "bytes", c.bytes);
  set_float(kw, "elapsed_seconds", c.elapsed_seconds);
  set_float(kw, "timeout_seconds", c.timeout_seconds);
  if (c.cause == FailureCause::kDied) kw["cause"] = "died";
  if (c.cause == FailureCause::kStalled) kw["cause"] = "stalled";
  nb::object cls = nb::borrow(errors_module()).attr(class_name);
  nb::object exc = cls(*nb::make_tuple(e.what(), e.message()), **kw);
  for (auto [key, value] : extra) nb::setattr(exc, key, value);
  PyErr_SetObject(cls.ptr(), exc.ptr());
}

void translate(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const InvalidArgument& e) {
    raise(e, "InvalidArgument");
  } catch (const InvalidUsage& e) {
    raise(e, "InvalidUsage");
  } catch (const BootstrapTimeoutError& e) {
    raise(e, "BootstrapTimeoutError");
  } catch (const BootstrapError& e) {
    raise(e, "BootstrapError");
  } catch (const TimeoutError& e) {
    raise(e, "TimeoutError");
  } catch (const PeerError& e) {
    raise(e, "PeerError");
  } catch (const CollectiveMismatchError& e) {
    raise(e, "CollectiveMismatchError");
  } catch (const ReplicaError& e) {
    raise(e, "ReplicaError");
  } catch (const BackendError& e) {
    nb::dict extra;
    extra["native_code"] = e.native_code();
    raise(e, "BackendError", extra);
  } catch (const CheckpointError& e) {
    nb::dict extra;
    extra["path"] = e.path();
    raise(e, "CheckpointError", extra);
  } catch (const InternalError& e) {
    raise(e, "InternalError");
  } catch (const Error& e) {
    raise(e, "Error");
  }
  // Anything else propagates to nanobind's own translators (std::bad_alloc -> MemoryError, ...).
}

}  // namespace

void bind_errors(nb::module_&) { nb::register_exception_translator(&translate); }

}  // namespace mwms::python
