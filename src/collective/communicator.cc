// The TCP ring communicator: bootstrap (rendezvous, ring formation), then every collective is a
// transfer plan (algorithms/) run by the channel (transport/tcp/). Scratch memory is grown to the
// largest message seen and reused, so steady-state collectives allocate nothing.
#include "mwms/communicator.h"

#include <cstring>
#include <vector>

#include "bootstrap/rendezvous.h"
#include "collective/algorithms/ring_algorithms.h"
#include "collective/selector.h"
#include "collective/transport/tcp/tcp_ring_connect.h"
#include "common/env.h"
#include "common/logging.h"
#include "kernels/reduce.h"
#include "mwms/errors.h"
#include "mwms/version.h"

namespace mwms {

Communicator::~Communicator() = default;

namespace collective {
namespace {

class TcpCommunicator final : public Communicator {
 public:
  TcpCommunicator(ResolvedCluster cluster, std::unique_ptr<TcpRingChannel> channel,
                  double timeout_seconds, std::size_t small_message_bytes)
      : cluster_(std::move(cluster)),
        channel_(std::move(channel)),
        timeout_(timeout_seconds),
        small_message_bytes_(small_message_bytes) {}

  int rank() const noexcept override { return cluster_.task_id; }
  int world_size() const noexcept override { return cluster_.num_workers; }
  std::uint64_t seq() const noexcept override { return seq_; }
  const ResolvedCluster& cluster() const noexcept override { return cluster_; }

  void all_reduce(void* buffer, std::size_t count, DataType dtype, ReduceOp op) override {
    CollectiveCall call = begin(CollectiveKind::kAllReduce, buffer, count, dtype, op, -1);
    if (world_size() == 1) return;
    run_all_reduce(call, static_cast<char*>(buffer));
  }

  void reduce_scatter(const void* send, void* recv, std::size_t recv_count, DataType dtype,
                      ReduceOp op) override {
    std::size_t n = static_cast<std::size_t>(world_size());
    check_pointer(send, recv_count, "reduce_scatter send");
    CollectiveCall call =
        begin(CollectiveKind::kReduceScatter, recv, recv_count * n, dtype, op, -1);
    std::size_t block = recv_count * dtype_size(dtype);
    if (world_size() == 1) {
      if (recv != send && block > 0) std::memmove(recv, send, block);
      return;
    }
    char* scratch = grow_scratch(2 * block);
    plan_reduce_scatter(call, static_cast<const char*>(send), static_cast<char*>(recv), scratch,
                        &plan_);
    execute(call);
  }

  void all_gather(const void* send, void* recv, std::size_t send_count, DataType dtype) override {
    std::size_t n = static_cast<std::size_t>(world_size());
    check_pointer(send, send_count, "all_gather send");
    CollectiveCall call = begin(CollectiveKind::kAllGather, recv, send_count * n, dtype,
                                ReduceOp::kSum, -1);
    std::size_t block = send_count * dtype_size(dtype);
    char* own = static_cast<char*>(recv) + static_cast<std::size_t>(rank()) * block;
    if (own != send && block > 0) std::memmove(own, send, block);
    if (world_size() == 1) return;
    plan_all_gather(call, static_cast<char*>(recv), &plan_);
    execute(call);
  }

  void broadcast(void* buffer, std::size_t count, DataType dtype, int root) override {
    if (root < 0 || root >= world_size()) {
      throw InvalidArgument("broadcast root " + std::to_string(root) + " is outside [0, " +
                                std::to_string(world_size()) + ")",
                            context("broadcast"));
    }
    CollectiveCall call = begin(CollectiveKind::kBroadcast, buffer, count, dtype, ReduceOp::kSum,
                                root);
    if (world_size() == 1) return;
    plan_broadcast(call, static_cast<char*>(buffer), &plan_);
    execute(call);
  }

  void barrier() override {
    std::int32_t token = 1;
    CollectiveCall call =
        begin(CollectiveKind::kBarrier, &token, 1, DataType::kInt32, ReduceOp::kSum, -1);
    if (world_size() == 1) return;
    run_all_reduce(call, reinterpret_cast<char*>(&token));
  }

  void abort(const std::string& reason) noexcept override {
    if (channel_) channel_->send_abort(rank(), reason);
    if (poisoned_.empty()) poisoned_ = "aborted by this process: " + reason;
  }

  ~TcpCommunicator() override = default;

 private:
  ErrorContext context(const char* op) const {
    ErrorContext ctx;
    ctx.rank = rank();
    ctx.world_size = world_size();
    ctx.task = cluster_.task_name();
    ctx.op = op;
    ctx.seq = static_cast<std::int64_t>(seq_);
    ctx.timeout_seconds = timeout_;
    return ctx;
  }

  void check_pointer(const void* p, std::size_t count, const char* what) const {
    if (p == nullptr && count > 0) {
      throw InvalidArgument(std::string(what) + " buffer is null but count is " +
                                std::to_string(count),
                            context(what));
    }
  }

  // Validates a call, assigns its sequence number and fails fast on a poisoned communicator.
  CollectiveCall begin(CollectiveKind kind, void* buffer, std::size_t count, DataType dtype,
                       ReduceOp op, int root) {
    const char* name = kind_name(kind);
    if (!poisoned_.empty()) {
      throw InvalidUsage(std::string("communicator is unusable after an earlier failure; rebuild "
                                     "it (restart the job): ") + poisoned_,
                         context(name));
    }
    check_pointer(buffer, count, name);
    if (dtype_size(dtype) == 0) throw InvalidArgument("unknown dtype", context(name));
    CollectiveCall call{kind, dtype, op, count, root, seq_++, rank(), world_size()};
    return call;
  }

  // The selector picks the plan; both plans reuse the one scratch buffer.
  void run_all_reduce(CollectiveCall& call, char* buffer) {
    const std::size_t bytes = call.count * dtype_size(call.dtype);
    AllReduceChoice choice = select_all_reduce(bytes, world_size(), small_message_bytes_);
    call.algorithm = static_cast<std::uint8_t>(choice.algorithm);
    MWMS_LOG_TRACE(kColl, kind_name(call.kind) << " seq " << call.seq << " " << bytes
                                               << " bytes: " << (call.algorithm ? "gather" : "ring")
                                               << " (" << choice.reason << ")");
    if (choice.algorithm == AllReduceAlgorithm::kGather) {
      char* gather = grow_scratch(bytes * static_cast<std::size_t>(world_size()));
      if (bytes > 0) std::memcpy(gather + static_cast<std::size_t>(rank()) * bytes, buffer, bytes);
      plan_gather_all_reduce(call, gather, &plan_);
      execute(call);
      finish_gather_all_reduce(call, gather, buffer);
      return;
    }
    char* scratch = grow_scratch(ring_segment(call.count, world_size(), 0).count *
                                 dtype_size(call.dtype));
    plan_all_reduce(call, buffer, scratch, &plan_);
    execute(call);
  }

  char* grow_scratch(std::size_t bytes) {
    if (scratch_.size() < bytes) {
      MWMS_LOG_DEBUG(kAlloc, "growing scratch from " << scratch_.size() << " to " << bytes << " bytes");
      scratch_.assign(bytes, 0);  // touched once here, reused by every later collective
    }
    return scratch_.data();
  }

  // Runs the current plan; on failure tells the neighbours, poisons, and rethrows.
  void execute(const CollectiveCall& call) {
    ReduceSink sink(plan_, call.dtype, call.op, world_size());
    ErrorContext ctx = context(kind_name(call.kind));
    ctx.seq = static_cast<std::int64_t>(call.seq);
    ctx.bytes = static_cast<std::int64_t>(call.count * dtype_size(call.dtype));
    try {
      channel_->run(plan_.transfers.data(), static_cast<int>(plan_.transfers.size()), &sink,
                    timeout_, ctx);
    } catch (const Error& e) {
      poisoned_ = e.what();
      int failed = e.context().peer_rank >= 0 ? e.context().peer_rank : rank();
      AbortCause cause = AbortCause::kPeer;
      if (dynamic_cast<const CollectiveMismatchError*>(&e) != nullptr) {
        cause = AbortCause::kMismatch;
        failed = rank();
      } else if (dynamic_cast<const TimeoutError*>(&e) != nullptr) {
        cause = AbortCause::kTimeout;
      }
      channel_->send_abort(failed, e.message(), cause);
      MWMS_LOG_WARN(kColl, "collective failed: " << e.what());
      throw;
    }
  }

  ResolvedCluster cluster_;
  std::unique_ptr<TcpRingChannel> channel_;
  double timeout_;
  std::size_t small_message_bytes_;
  std::uint64_t seq_ = 0;
  std::vector<char> scratch_;
  RingPlan plan_;
  std::string poisoned_;
};

double positive_or(double value, const char* env_name) {
  return value > 0 ? value : common::env_double(env_name);
}

}  // namespace
}  // namespace collective

std::unique_ptr<Communicator> Communicator::create(const ResolvedCluster& cluster,
                                                   const CommunicatorOptions& options) {
  using namespace collective;
  if (options.implementation == Implementation::kNccl) {
    throw InvalidArgument("Implementation::kNccl needs a build with NCCL and GPU buffers; this "
                          "build has only the TCP ring (use kAuto or kRing)");
  }
  double timeout = positive_or(options.timeout_seconds, "MWMS_TIMEOUT_SECONDS");
  double connect_timeout =
      positive_or(options.connect_timeout_seconds, "MWMS_CONNECT_TIMEOUT_SECONDS");
  long long chunk = options.chunk_bytes > 0 ? static_cast<long long>(options.chunk_bytes)
                                            : common::env_int("MWMS_CHUNK_BYTES");
  if (chunk < 4096) throw InvalidArgument("chunk_bytes must be at least 4096");
  TcpRingOptions ring;
  ring.connect_timeout_seconds = connect_timeout;
  ring.chunk_bytes = static_cast<std::size_t>(chunk) / 64 * 64;  // whole elements of any dtype
  ring.spin_seconds = static_cast<double>(common::env_int("MWMS_SPIN_MICROSECONDS")) * 1e-6;

  for (const std::string& name : common::unknown_env_vars()) {
    MWMS_LOG_WARN(kEnv, "unknown environment variable " << name << " ignored (see docs/env.md)");
  }
  if (!cluster.in_ring && cluster.num_workers > 1) {
    throw InvalidArgument("a task outside the training ring (" + cluster.task_name() +
                          ") is its own world of one, but num_workers is " +
                          std::to_string(cluster.num_workers));
  }
  bootstrap::RendezvousResult rv = bootstrap::rendezvous(cluster, connect_timeout);
  std::unique_ptr<TcpRingChannel> channel;
  if (rv.cluster.num_workers > 1 && rv.cluster.in_ring) {
    channel = connect_tcp_ring(rv.cluster, rv.listener, ring);
  }
  if (rv.cluster.is_chief) {
    MWMS_LOG_INFO(kInit, "libmwms " << MWMS_VERSION_STRING);
    for (const auto& var : common::env_registry()) {
      MWMS_LOG_INFO(kEnv, var.name << " " << common::env_string(var.name));
    }
    MWMS_LOG_INFO(kInit, "libmwms communicator ready: world size " << rv.cluster.num_workers
                                                                  << ", transport tcp ring, chunk "
                                                                  << ring.chunk_bytes << " bytes");
  }
  long long small = options.small_message_bytes >= 0 ? options.small_message_bytes
                                                    : common::env_int("MWMS_SMALL_MESSAGE_BYTES");
  if (small < 0) throw InvalidArgument("MWMS_SMALL_MESSAGE_BYTES must be >= 0");
  return std::make_unique<TcpCommunicator>(std::move(rv.cluster), std::move(channel), timeout,
                                           static_cast<std::size_t>(small));
}

}  // namespace mwms
