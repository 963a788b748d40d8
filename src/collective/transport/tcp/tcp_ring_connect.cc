#include "collective/transport/tcp/tcp_ring_connect.h"

#include <nlohmann/json.hpp>

#include "common/logging.h"
#include "mwms/errors.h"

namespace mwms::collective {

namespace {

using bootstrap::MessageKind;
using nlohmann::json;

ErrorContext ring_context(const ResolvedCluster& c, int peer) {
  ErrorContext ctx;
  ctx.rank = c.task_id;
  ctx.world_size = c.num_workers;
  ctx.task = c.task_name();
  ctx.op = "ring formation";
  ctx.transport = "tcp";
  ctx.peer_rank = peer;
  ctx.peer_task = c.task_name_of_rank(peer);
  ctx.peer_address = c.ring[peer];
  return ctx;
}

common::Socket connect_to(const ResolvedCluster& c, int peer, MessageKind kind,
                          common::Deadline deadline, double timeout) {
  auto [host, port] = split_address(c.ring[peer]);
  std::string error;
  common::Socket s = common::connect_tcp(host, port, deadline, &error);
  json hello{{"rank", c.task_id}, {"fingerprint", c.cluster.fingerprint()}};
  if (!s.valid() ||
      bootstrap::send_message(s.fd(), kind, hello.dump(), deadline).status != common::IoStatus::kOk) {
    throw BootstrapError(c.task_name() + " could not connect to its ring successor " +
                             c.task_name_of_rank(peer) + " at " + c.ring[peer] + " within " +
                             std::to_string(static_cast<int>(timeout)) + " s: " + error,
                         ring_context(c, peer));
  }
  return s;
}

}  // namespace

std::unique_ptr<TcpRingChannel> connect_tcp_ring(const ResolvedCluster& c,
                                                 const common::Socket& listener,
                                                 const TcpRingOptions& options) {
  const int n = c.num_workers;
  const int next = (c.task_id + 1) % n;
  const int prev = (c.task_id + n - 1) % n;
  common::Deadline deadline = common::deadline_after(options.connect_timeout_seconds);
  common::Socket data_next = connect_to(c, next, MessageKind::kRingData, deadline,
                                        options.connect_timeout_seconds);
  common::Socket ctrl_next = connect_to(c, next, MessageKind::kRingControl, deadline,
                                        options.connect_timeout_seconds);
  common::Socket data_prev, ctrl_prev;
  while (!data_prev.valid() || !ctrl_prev.valid()) {
    common::IoResult r;
    common::Socket s = common::accept_until(listener, deadline, &r);
    if (!s.valid()) {
      throw BootstrapError(c.task_name() + " waited " +
                               std::to_string(static_cast<int>(options.connect_timeout_seconds)) +
                               " s for its ring predecessor " + c.task_name_of_rank(prev) + " (" +
                               c.ring[prev] + ") to connect: " + r.describe(),
                           ring_context(c, prev));
    }
    MessageKind kind;
    std::string text;
    // Our predecessor sends its hello right after connecting; a silent or foreign client must
    // not hold up ring formation.
    common::Deadline hello_deadline = std::min(deadline, common::deadline_after(3.0));
    if (bootstrap::recv_message(s.fd(), &kind, &text, hello_deadline).status !=
        common::IoStatus::kOk) {
      MWMS_LOG_WARN(kRing, "ignoring a connection that sent no ring hello");
      continue;
    }
    json hello = json::parse(text, nullptr, false);
    bool from_prev = hello.is_object() && hello.contains("rank") &&
                     hello["rank"].is_number_integer() && hello["rank"].get<int>() == prev &&
                     hello.contains("fingerprint") && hello["fingerprint"].is_string() &&
                     hello["fingerprint"].get<std::string>() == c.cluster.fingerprint();
    if (!from_prev) {
      MWMS_LOG_WARN(kRing, "ignoring a ring connection that is not from rank "
                               << prev << " of this cluster: " << text.substr(0, 200));
      continue;
    }
    if (kind == MessageKind::kRingData && !data_prev.valid()) data_prev = std::move(s);
    if (kind == MessageKind::kRingControl && !ctrl_prev.valid()) ctrl_prev = std::move(s);
  }
  common::tune_stream_socket(data_next.fd());
  common::tune_stream_socket(data_prev.fd());
  common::tune_stream_socket(ctrl_next.fd());
  common::tune_stream_socket(ctrl_prev.fd());
  RingNeighbours nb;
  nb.prev_rank = prev;
  nb.next_rank = next;
  nb.addresses = c.ring;
  for (int r = 0; r < n; ++r) nb.tasks.push_back(c.task_name_of_rank(r));
  MWMS_LOG_DEBUG(kRing, "ring connected: prev " << prev << " next " << next);
  return std::make_unique<TcpRingChannel>(std::move(data_next), std::move(data_prev),
                                          std::move(ctrl_next), std::move(ctrl_prev),
                                          std::move(nb), options.chunk_bytes, options.spin_seconds);
}

}  // namespace mwms::collective
