// DeviceCommunicator: the public face of the device backends, NCCL (backend/nccl_backend.h) and
// host-staged (backend/staged_backend.h).
//
// Note [device backend choice]: CommunicatorOptions::implementation picks the backend. kNccl is
// NCCL or an error; kRing is the host-staged path (the engine over shm/TCP/MPI on pinned copies);
// kAuto is NCCL when every rank can use it, else host-staged for all. Ranks must agree (one rank
// on NCCL and another on the engine would wait for each other forever), so kAuto first builds
// the engine's communicator (its rendezvous and links), all-gathers one record per rank (a hash
// of its host id, its CUDA device count, whether its build has NCCL) and decides from the
// gathered records, which are the same on every rank: NCCL when every rank's build has it, every
// rank sees a device and no host runs more ranks than it has devices (NCCL refuses two ranks on
// one GPU: "Duplicate GPU detected"). Then either the engine becomes the staged backend's, or
// rank 0's NCCL unique id is broadcast over it and it is finalized before the NCCL communicator
// is created. The choice and its reason are logged at info by rank 0. The id's two carriers (the
// engine's broadcast here, rank 0's peer info for kNccl): Note [nccl unique id] in
// backend/nccl_unique_id.cc.
#include "collective/device_communicator.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <optional>
#include <string_view>
#include <vector>

#include "bootstrap/error_context.h"
#include "bootstrap/peer_info.h"
#include "bootstrap/rendezvous.h"
#include "collective/backend/nccl_backend.h"
#include "collective/backend/staged_backend.h"
#include "collective/communicator_factory.h"
#include "collective/option_values.h"
#include "common/env.h"
#include "common/logging.h"
#include "mwms/errors.h"

namespace mwms {

DeviceCommunicator::~DeviceCommunicator() = default;

// The blocking names: the _async call, then its Work waited under the collective's deadline.
namespace {
std::shared_ptr<Work> completed(std::shared_ptr<Work> work) {
  work->wait();
  return work;
}
}  // namespace

std::shared_ptr<Work> DeviceCommunicator::all_reduce(void* buffer, std::size_t count,
                                                     DataType dtype, ReduceOp op,
                                                     DeviceStream stream) {
  return completed(all_reduce_async(buffer, count, dtype, op, stream));
}

std::shared_ptr<Work> DeviceCommunicator::all_reduce_bucket(const DeviceTensor* tensors,
                                                            std::size_t num_tensors, DataType dtype,
                                                            ReduceOp op, DeviceStream stream) {
  return completed(all_reduce_bucket_async(tensors, num_tensors, dtype, op, stream));
}

std::shared_ptr<Work> DeviceCommunicator::reduce_scatter(const void* send, void* recv,
                                                         std::size_t recv_count, DataType dtype,
                                                         ReduceOp op, DeviceStream stream) {
  return completed(reduce_scatter_async(send, recv, recv_count, dtype, op, stream));
}

std::shared_ptr<Work> DeviceCommunicator::all_gather(const void* send, void* recv,
                                                     std::size_t send_count, DataType dtype,
                                                     DeviceStream stream) {
  return completed(all_gather_async(send, recv, send_count, dtype, stream));
}

std::shared_ptr<Work> DeviceCommunicator::broadcast(void* buffer, std::size_t count, DataType dtype,
                                                    int root, DeviceStream stream) {
  return completed(broadcast_async(buffer, count, dtype, root, stream));
}

std::unique_ptr<DeviceCommunicator> DeviceCommunicator::create(const ResolvedCluster& cluster,
                                                               const CommunicatorOptions& options) {
  return collective::create_device_communicator(cluster, options, collective::real_nccl_api(),
                                                collective::real_cuda_api());
}

namespace collective {

namespace {

class DeviceCommunicatorImpl final : public DeviceCommunicator {
 public:
  DeviceCommunicatorImpl(ResolvedCluster cluster, std::unique_ptr<DeviceBackend> backend)
      : cluster_(std::move(cluster)), backend_(std::move(backend)) {}

  int rank() const noexcept override { return cluster_.task_id; }
  int world_size() const noexcept override { return std::max(1, cluster_.num_workers); }
  int device() const noexcept override { return backend_->device(); }

  std::shared_ptr<Work> all_reduce_async(void* buffer, std::size_t count, DataType dtype,
                                         ReduceOp op, DeviceStream stream) override {
    DeviceCall c{DeviceCollective::kAllReduce, buffer, buffer, count, dtype, op, 0};
    return backend_->launch(&c, 1, stream.handle);
  }

  std::shared_ptr<Work> all_reduce_bucket_async(const DeviceTensor* tensors,
                                                std::size_t num_tensors, DataType dtype,
                                                ReduceOp op, DeviceStream stream) override {
    calls_.clear();
    for (std::size_t i = 0; i < num_tensors; ++i) {
      calls_.push_back({DeviceCollective::kAllReduce, tensors[i].data, tensors[i].data,
                        tensors[i].count, dtype, op, 0});
    }
    return backend_->launch(calls_.data(), calls_.size(), stream.handle);
  }

  std::shared_ptr<Work> reduce_scatter_async(const void* send, void* recv, std::size_t recv_count,
                                             DataType dtype, ReduceOp op,
                                             DeviceStream stream) override {
    DeviceCall c{DeviceCollective::kReduceScatter, send, recv, recv_count, dtype, op, 0};
    return backend_->launch(&c, 1, stream.handle);
  }

  std::shared_ptr<Work> all_gather_async(const void* send, void* recv, std::size_t send_count,
                                         DataType dtype, DeviceStream stream) override {
    DeviceCall c{DeviceCollective::kAllGather, send, recv, send_count, dtype, ReduceOp::kSum, 0};
    return backend_->launch(&c, 1, stream.handle);
  }

  std::shared_ptr<Work> broadcast_async(void* buffer, std::size_t count, DataType dtype, int root,
                                        DeviceStream stream) override {
    DeviceCall c{DeviceCollective::kBroadcast, buffer, buffer, count, dtype, ReduceOp::kSum, root};
    return backend_->launch(&c, 1, stream.handle);
  }

  void barrier(DeviceStream stream) override { backend_->barrier(stream.handle); }
  void finalize() override { backend_->finalize(); }

  std::string describe() const override { return backend_->describe(); }
  void abort(const std::string& reason) noexcept override { backend_->abort(reason); }

 private:
  ResolvedCluster cluster_;
  std::unique_ptr<DeviceBackend> backend_;
  std::vector<DeviceCall> calls_;  // reused by all_reduce_bucket
};

// A CommunicatorOptions duration (Note [option sentinels]), named in its warning by its variable.
double positive_or(const std::optional<double>& value, const char* env_name) {
  const bool timeout = std::string_view(env_name) == "MWMS_TIMEOUT_SECONDS";
  return seconds_option(value,
                        timeout ? "CommunicatorOptions::timeout_seconds"
                                : "CommunicatorOptions::connect_timeout_seconds",
                        env_name);
}

// STYLE item 23: say which NCCL_DEBUG NCCL sees; it is NCCL's variable, never set by us.
void log_nccl_debug(const NcclApi& api) {
  const char* nccl_debug = std::getenv("NCCL_DEBUG");
  MWMS_LOG_INFO(kInit, "nccl backend (" << api.name << "), NCCL_DEBUG "
                                        << (nccl_debug ? nccl_debug : "unset"));
}

// Implementation::kNccl: the NCCL id in rank 0's peer info (Note [nccl unique id]).
std::unique_ptr<DeviceCommunicator> create_nccl(const ResolvedCluster& cluster,
                                                const CommunicatorOptions& options,
                                                const NcclApi* api, const CudaApi* cuda) {
  const double timeout = positive_or(options.timeout_seconds, "MWMS_TIMEOUT_SECONDS");
  const double connect_timeout =
      positive_or(options.connect_timeout_seconds, "MWMS_CONNECT_TIMEOUT_SECONDS");
  ErrorContext ctx = bootstrap::task_context(cluster, "nccl unique id");
  ctx.transport = "nccl";
  // Note [nccl unique id]: rank 0 makes the message (status and id) and publishes it in its peer
  // info; a failing ncclGetUniqueId is read from it on every rank, rank 0's own included.
  bootstrap::PeerInfo mine;
  mine.transport = "nccl";
  UniqueIdMessage message{};
  if (cluster.task_id == 0) mine.blobs["nccl"] = to_hex(message = make_unique_id_message(*api));
  bootstrap::RendezvousResult rv = bootstrap::rendezvous(cluster, connect_timeout, mine);
  const ResolvedCluster& c = rv.cluster;
  int local_rank = c.local_rank;
  if (!rv.peers.empty()) {
    const bootstrap::PeerInfo& leader = rv.peers.front();
    auto blob = leader.blobs.find("nccl");
    if (blob == leader.blobs.end() || !from_hex(blob->second, &message)) {
      ctx.peer_rank = 0;
      ctx.peer_address = leader.address;
      throw BootstrapError("rank 0 published no valid NCCL unique id (is it a DeviceCommunicator "
                           "too, with the same libmwms?)", ctx);
    }
    const bootstrap::PeerInfo& me = rv.peers[static_cast<std::size_t>(c.task_id)];
    local_rank = me.local_rank;
    // Say it plainly rather than let NCCL fail with "Duplicate GPU detected" (every rank of this
    // host sees the same; ranks elsewhere then time out in NCCL's init).
    int devices = 0;
    if (cuda != nullptr && cuda->get_device_count(&devices) == 0 && devices > 0 &&
        me.local_size > devices) {
      throw InvalidUsage("Implementation::kNccl: " + std::to_string(me.local_size) +
                             " ranks on this host share " + std::to_string(devices) +
                             " CUDA device(s), and NCCL refuses two ranks on one GPU; use kAuto "
                             "or kRing (the host-staged path)", ctx);
    }
  }
  const NcclUniqueId id = read_unique_id_message(*api, message, c.task_id == 0, "rank 0", ctx);
  NcclBackendOptions o;
  o.rank = c.task_id;
  o.world_size = std::max(1, c.num_workers);
  o.local_rank = local_rank;
  o.timeout_seconds = timeout;
  o.init_timeout_seconds = connect_timeout;
  o.context.task = c.task_name();
  if (c.task_id == 0) log_nccl_debug(*api);
  auto backend = std::make_unique<NcclBackend>(*api, id, o);
  return std::make_unique<DeviceCommunicatorImpl>(std::move(rv.cluster), std::move(backend));
}


// What one rank tells the others for the kAuto choice (Note [device backend choice]).
struct RankRecord {
  std::int64_t host_hash = 0;
  std::int64_t devices = 0;
  std::int64_t nccl = 0;
};

// FNV-1a: the same on every rank and build (std::hash need not be).
std::int64_t hash_of(const std::string& text) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return static_cast<std::int64_t>(h);
}

// Empty when every rank can use NCCL, else why not (the first rank that cannot).
std::string why_not_nccl(const std::vector<RankRecord>& records) {
  std::map<std::int64_t, int> per_host;
  for (const RankRecord& r : records) ++per_host[r.host_hash];
  for (std::size_t i = 0; i < records.size(); ++i) {
    const RankRecord& r = records[i];
    const std::string rank = "rank " + std::to_string(i);
    if (r.nccl == 0) return rank + "'s libmwms has no NCCL";
    if (r.devices <= 0) return rank + " sees no CUDA device";
    const int sharing = per_host[r.host_hash];
    if (sharing > r.devices) {
      return rank + "'s host runs " + std::to_string(sharing) + " ranks on " +
             std::to_string(r.devices) + " device(s) (NCCL refuses two ranks on one GPU)";
    }
  }
  return "";
}

std::unique_ptr<Communicator> make_engine(const ResolvedCluster& cluster,
                                          const CommunicatorOptions& options) {
  CommunicatorOptions engine = options;
  engine.implementation = Implementation::kRing;
  return create_communicator(cluster, engine);
}

std::unique_ptr<DeviceCommunicator> make_staged(std::unique_ptr<Communicator> engine,
                                                const CommunicatorOptions& options,
                                                const CudaApi& cuda) {
  StagedBackendOptions o;
  o.local_rank = engine->cluster().local_rank;
  o.timeout_seconds = positive_or(options.timeout_seconds, "MWMS_TIMEOUT_SECONDS");
  o.context.task = engine->cluster().task_name();
  ResolvedCluster c = engine->cluster();
  auto backend = std::make_unique<StagedBackend>(cuda, std::move(engine), o);
  if (c.task_id == 0) MWMS_LOG_INFO(kInit, "device communicator: " << backend->describe());
  return std::make_unique<DeviceCommunicatorImpl>(std::move(c), std::move(backend));
}

// kAuto once NCCL was chosen: rank 0's id (and whether making it failed) over the engine.
std::unique_ptr<DeviceCommunicator> nccl_over_engine(std::unique_ptr<Communicator> engine,
                                                     const CommunicatorOptions& options,
                                                     const NcclApi& api) {
  ResolvedCluster c = engine->cluster();
  const NcclUniqueId id =
      share_unique_id(api, *engine, "rank 0", bootstrap::task_context(c, "nccl unique id"));
  engine->finalize();  // every rank: a barrier, then the links close in order
  NcclBackendOptions o;
  o.rank = c.task_id;
  o.world_size = std::max(1, c.num_workers);
  o.local_rank = c.local_rank;
  o.timeout_seconds = positive_or(options.timeout_seconds, "MWMS_TIMEOUT_SECONDS");
  o.init_timeout_seconds =
      positive_or(options.connect_timeout_seconds, "MWMS_CONNECT_TIMEOUT_SECONDS");
  o.context.task = c.task_name();
  engine.reset();
  if (c.task_id == 0) log_nccl_debug(api);
  auto backend = std::make_unique<NcclBackend>(api, id, o);
  return std::make_unique<DeviceCommunicatorImpl>(std::move(c), std::move(backend));
}

}  // namespace

std::unique_ptr<DeviceCommunicator> create_device_communicator(const ResolvedCluster& cluster,
                                                               const CommunicatorOptions& options,
                                                               const NcclApi* nccl,
                                                               const CudaApi* cuda) {
  switch (options.implementation) {
    case Implementation::kNccl:
      if (nccl == nullptr) {
        throw InvalidUsage("Implementation::kNccl needs a libmwms built with NCCL "
                           "(MWMS_WITH_CUDA=ON and NCCL found); this build has MWMS_HAVE_NCCL 0");
      }
      return create_nccl(cluster, options, nccl, cuda);
    case Implementation::kRing:
      if (cuda == nullptr) {
        throw InvalidUsage("DeviceCommunicator's host-staged path (Implementation::kRing) needs a "
                           "libmwms built with CUDA (MWMS_WITH_CUDA=ON); this build has "
                           "MWMS_HAVE_CUDA 0");
      }
      return make_staged(make_engine(cluster, options), options, *cuda);
    case Implementation::kAuto: break;
  }
  if (cuda == nullptr) {
    if (nccl != nullptr) return create_nccl(cluster, options, nccl, cuda);
    throw InvalidUsage("DeviceCommunicator needs a libmwms built with CUDA (MWMS_WITH_CUDA=ON); "
                       "this build has MWMS_HAVE_CUDA 0 and MWMS_HAVE_NCCL 0");
  }
  // Note [device backend choice].
  std::unique_ptr<Communicator> engine = make_engine(cluster, options);
  RankRecord mine;
  mine.host_hash = hash_of(bootstrap::local_host_id());
  int devices = 0;
  // The device count, or minus cudaGetDeviceCount's error (35: no driver), or 0 (no GPU).
  const int status = cuda->get_device_count(&devices);
  mine.devices = status == 0 ? devices : -static_cast<std::int64_t>(status);
  mine.nccl = nccl != nullptr ? 1 : 0;
  std::vector<RankRecord> records(static_cast<std::size_t>(engine->world_size()));
  static_assert(sizeof(RankRecord) == 3 * sizeof(std::int64_t), "RankRecord is 3 int64");
  engine->all_gather(&mine, records.data(), 3, DataType::kInt64);
  // Neither backend runs without a device on every rank: every rank says so now, together (the
  // records are the same everywhere), rather than one rank failing in its backend while the
  // others wait for it in their first collective.
  for (std::size_t i = 0; i < records.size(); ++i) {
    if (records[i].devices > 0) continue;
    ErrorContext ctx = bootstrap::task_context(engine->cluster(), "device communicator init");
    ctx.transport = "cuda";
    const int code =
        records[i].devices < 0 ? static_cast<int>(-records[i].devices) : kCudaErrorNoDevice;
    engine->finalize();  // in order: no peer takes this for a death
    if (static_cast<int>(i) == ctx.rank) {
      std::rethrow_exception(cuda_error(
          code, cuda->error_string(code),
          "no usable CUDA device on this machine (no NVIDIA driver or no GPU; DeviceCommunicator "
          "needs one per rank, CPU buffers go through Communicator): cudaGetDeviceCount",
          ctx));
    }
    ctx.peer_rank = static_cast<int>(i);
    throw BackendError("rank " + std::to_string(i) + " has no usable CUDA device (its "
                           "cudaGetDeviceCount: CUDA error " + std::to_string(code) +
                           "); DeviceCommunicator needs one on every rank",
                       code, ctx);
  }
  const std::string why = why_not_nccl(records);
  if (why.empty()) {
    if (engine->rank() == 0) {
      MWMS_LOG_INFO(kInit, "device communicator: nccl (implementation auto: every rank has a "
                           "device of its own)");
    }
    return nccl_over_engine(std::move(engine), options, *nccl);
  }
  if (engine->rank() == 0) {
    MWMS_LOG_INFO(kInit, "device communicator: host-staged for all ranks (implementation auto: "
                             << why << ")");
  }
  return make_staged(std::move(engine), options, *cuda);
}

}  // namespace collective

}  // namespace mwms
