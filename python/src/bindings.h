// Declarations shared by the files of the _mwms extension (python/src). The extension sees only
// libmwms's public headers (include/mwms); each file binds one part of the API.
#pragma once

#include <nanobind/nanobind.h>

#include <string>
#include <variant>

#include "mwms/types.h"

namespace mwms::python {

namespace nb = nanobind;

/// A reduce op as Python passes it: a ReduceOp member or its name ("sum", "mean", ...).
using ReduceOpArg = std::variant<std::string, ReduceOp>;
/// The ReduceOp of `op`. @throws InvalidArgument (a ValueError in Python) for an unknown name.
ReduceOp to_reduce_op(const ReduceOpArg& op);

void bind_errors(nb::module_& m);        // errors.cc: the exception translator
void bind_cluster(nb::module_& m);       // cluster.cc: Cluster, resolve*()
void bind_communicator(nb::module_& m);  // communicator.cc: Communicator, Work, ReduceOp
void bind_strategy(nb::module_& m);      // strategy.cc: MultiWorkerMirroredStrategy

}  // namespace mwms::python
