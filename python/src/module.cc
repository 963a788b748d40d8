// The _mwms extension module: Python bindings of libmwms's public API (docs/python.md). The
// package mwms (python/mwms/__init__.py) re-exports everything from here.
#include "bindings.h"
#include "mwms/config.h"
#include "mwms/version.h"

NB_MODULE(_mwms, m) {
  m.doc() = "libmwms's C++ API for Python (use the package: import mwms).";
  m.attr("__version__") = MWMS_VERSION_STRING;
  m.attr("HAVE_MPI") = static_cast<bool>(MWMS_HAVE_MPI);    // this build's MPI bootstrap/transport
  m.attr("HAVE_CUDA") = static_cast<bool>(MWMS_HAVE_CUDA);  // CUDA in the library (not bound yet)
  mwms::python::bind_errors(m);
  mwms::python::bind_cluster(m);
  mwms::python::bind_communicator(m);
  mwms::python::bind_strategy(m);
}
