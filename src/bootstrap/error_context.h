// The ErrorContext of a task in a resolved cluster: the one place that fills rank, world size,
// task and, for a peer, its rank, task and ring address, for every layer above bootstrap.
#pragma once

#include <string>

#include "mwms/cluster.h"
#include "mwms/errors.h"

namespace mwms::bootstrap {

/// This task's context in `c` for phase or collective `op`: rank (c.task_id), world size
/// (c.num_workers), task name (c.task_name()); every other field left unset for the caller.
/// Never throws mwms::Error (std::bad_alloc only).
ErrorContext task_context(const ResolvedCluster& c, std::string op);

/// task_context() plus `peer`'s rank, task name and ring address ("host:port"; left empty for a
/// rank outside the ring, and for peer < 0 no peer field is set). Never throws mwms::Error.
ErrorContext peer_context(const ResolvedCluster& c, std::string op, int peer);

}  // namespace mwms::bootstrap
