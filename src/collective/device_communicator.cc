// DeviceCommunicator: the public face of the NCCL backend (backend/nccl_backend.h).
//
// Note [nccl unique id]: NCCL needs its 128-byte unique id, made by one rank with
// ncclGetUniqueId, on every rank before ncclCommInitRankConfig. We send it through our own
// bootstrap rather than NCCL's or MPI's: rank 0 makes the id before the rendezvous and publishes
// it, hex-encoded, as the "nccl" blob of its peer info; the rendezvous (TF_CONFIG's TCP exchange,
// or MPI's for mpirun jobs) hands every rank every peer's info, so each rank reads rank 0's blob.
// Any launcher our bootstrap understands therefore works, and the id never needs a side channel.
#include "collective/device_communicator.h"

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "bootstrap/rendezvous.h"
#include "collective/backend/nccl_backend.h"
#include "common/env.h"
#include "common/logging.h"
#include "mwms/errors.h"

namespace mwms {

DeviceCommunicator::~DeviceCommunicator() = default;

std::unique_ptr<DeviceCommunicator> DeviceCommunicator::create(const ResolvedCluster& cluster,
                                                               const CommunicatorOptions& options) {
  return collective::create_device_communicator(cluster, options, collective::real_nccl_api());
}

namespace collective {

namespace {

class DeviceCommunicatorImpl final : public DeviceCommunicator {
 public:
  DeviceCommunicatorImpl(ResolvedCluster cluster, std::unique_ptr<NcclBackend> backend)
      : cluster_(std::move(cluster)), backend_(std::move(backend)) {}

  int rank() const noexcept override { return cluster_.task_id; }
  int world_size() const noexcept override { return std::max(1, cluster_.num_workers); }
  int device() const noexcept override { return backend_->device(); }

  std::shared_ptr<Work> all_reduce(void* buffer, std::size_t count, DataType dtype, ReduceOp op,
                                   DeviceStream stream) override {
    DeviceCall c{DeviceCollective::kAllReduce, buffer, buffer, count, dtype, op, 0};
    return backend_->launch(&c, 1, stream.handle);
  }

  std::shared_ptr<Work> all_reduce_bucket(const DeviceTensor* tensors, std::size_t num_tensors,
                                          DataType dtype, ReduceOp op,
                                          DeviceStream stream) override {
    calls_.clear();
    for (std::size_t i = 0; i < num_tensors; ++i) {
      calls_.push_back({DeviceCollective::kAllReduce, tensors[i].data, tensors[i].data,
                        tensors[i].count, dtype, op, 0});
    }
    return backend_->launch(calls_.data(), calls_.size(), stream.handle);
  }

  std::shared_ptr<Work> reduce_scatter(const void* send, void* recv, std::size_t recv_count,
                                       DataType dtype, ReduceOp op, DeviceStream stream) override {
    DeviceCall c{DeviceCollective::kReduceScatter, send, recv, recv_count, dtype, op, 0};
    return backend_->launch(&c, 1, stream.handle);
  }

  std::shared_ptr<Work> all_gather(const void* send, void* recv, std::size_t send_count,
                                   DataType dtype, DeviceStream stream) override {
    DeviceCall c{DeviceCollective::kAllGather, send, recv, send_count, dtype, ReduceOp::kSum, 0};
    return backend_->launch(&c, 1, stream.handle);
  }

  std::shared_ptr<Work> broadcast(void* buffer, std::size_t count, DataType dtype, int root,
                                  DeviceStream stream) override {
    DeviceCall c{DeviceCollective::kBroadcast, buffer, buffer, count, dtype, ReduceOp::kSum, root};
    return backend_->launch(&c, 1, stream.handle);
  }

  std::string describe() const override { return backend_->describe(); }
  void abort(const std::string& reason) noexcept override { backend_->abort(reason); }

 private:
  ResolvedCluster cluster_;
  std::unique_ptr<NcclBackend> backend_;
  std::vector<DeviceCall> calls_;  // reused by all_reduce_bucket
};

constexpr char kHexDigits[] = "0123456789abcdef";

}  // namespace

std::string to_hex(const NcclUniqueId& id) {
  std::string text;
  text.reserve(id.bytes.size() * 2);
  for (unsigned char b : id.bytes) {
    text += kHexDigits[b >> 4];
    text += kHexDigits[b & 15];
  }
  return text;
}

bool from_hex(const std::string& text, NcclUniqueId* id) {
  if (text.size() != id->bytes.size() * 2) return false;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  for (std::size_t i = 0; i < id->bytes.size(); ++i) {
    const int hi = nibble(text[2 * i]), lo = nibble(text[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    id->bytes[i] = static_cast<unsigned char>(hi * 16 + lo);
  }
  return true;
}

std::unique_ptr<DeviceCommunicator> create_device_communicator(const ResolvedCluster& cluster,
                                                               const CommunicatorOptions& options,
                                                               const NcclApi* api) {
  if (api == nullptr) {
    throw InvalidUsage("DeviceCommunicator needs a libmwms built with NCCL (MWMS_WITH_CUDA=ON "
                       "and NCCL found); this build has MWMS_HAVE_NCCL 0");
  }
  const double timeout = options.timeout_seconds > 0 ? options.timeout_seconds
                                                     : common::env_double("MWMS_TIMEOUT_SECONDS");
  const double connect_timeout = options.connect_timeout_seconds > 0
                                     ? options.connect_timeout_seconds
                                     : common::env_double("MWMS_CONNECT_TIMEOUT_SECONDS");
  ErrorContext ctx;
  ctx.rank = cluster.task_id;
  ctx.world_size = cluster.num_workers;
  ctx.task = cluster.task_name();
  ctx.op = "nccl unique id";
  ctx.transport = "nccl";
  // Note [nccl unique id]: rank 0 makes it and publishes it in its peer info.
  bootstrap::PeerInfo mine;
  mine.transport = "nccl";
  NcclUniqueId id;
  if (cluster.task_id == 0) {
    const int r = api->get_unique_id(&id);
    if (r != kNcclSuccess) {
      std::rethrow_exception(to_error(*api, NativeSource::kNccl, r, "ncclGetUniqueId", nullptr, ctx));
    }
    mine.blobs["nccl"] = to_hex(id);
  }
  bootstrap::RendezvousResult rv = bootstrap::rendezvous(cluster, connect_timeout, mine);
  const ResolvedCluster& c = rv.cluster;
  int local_rank = c.local_rank;
  if (!rv.peers.empty()) {
    const bootstrap::PeerInfo& leader = rv.peers.front();
    auto blob = leader.blobs.find("nccl");
    if (blob == leader.blobs.end() || !from_hex(blob->second, &id)) {
      ctx.peer_rank = 0;
      ctx.peer_address = leader.address;
      throw BootstrapError("rank 0 published no valid NCCL unique id (is it a DeviceCommunicator "
                           "too, with the same libmwms?)", ctx);
    }
    local_rank = rv.peers[static_cast<std::size_t>(c.task_id)].local_rank;
  }
  NcclBackendOptions o;
  o.rank = c.task_id;
  o.world_size = std::max(1, c.num_workers);
  o.local_rank = local_rank;
  o.timeout_seconds = timeout;
  o.init_timeout_seconds = connect_timeout;
  o.context.task = c.task_name();
  if (c.task_id == 0) {
    // STYLE item 23: say which NCCL_DEBUG NCCL sees; it is NCCL's variable, never set by us.
    const char* nccl_debug = std::getenv("NCCL_DEBUG");
    MWMS_LOG_INFO(kInit, "nccl backend (" << api->name << "), NCCL_DEBUG "
                                          << (nccl_debug ? nccl_debug : "unset"));
  }
  auto backend = std::make_unique<NcclBackend>(*api, id, o);
  return std::make_unique<DeviceCommunicatorImpl>(std::move(rv.cluster), std::move(backend));
}

}  // namespace collective

}  // namespace mwms
