#include "bootstrap/error_context.h"

#include <utility>

namespace mwms::bootstrap {

ErrorContext task_context(const ResolvedCluster& c, std::string op) {
  ErrorContext ctx;
  ctx.rank = c.task_id;
  ctx.world_size = c.num_workers;
  ctx.task = c.task_name();
  ctx.op = std::move(op);
  return ctx;
}

ErrorContext peer_context(const ResolvedCluster& c, std::string op, int peer) {
  ErrorContext ctx = task_context(c, std::move(op));
  if (peer < 0) return ctx;
  ctx.peer_rank = peer;
  ctx.peer_task = c.task_name_of_rank(peer);
  if (peer < static_cast<int>(c.ring.size())) {
    ctx.peer_address = c.ring[static_cast<std::size_t>(peer)];
  }
  return ctx;
}

}  // namespace mwms::bootstrap
