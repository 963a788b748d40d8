// DeviceGroup over the NCCL replica group (backend/nccl_group.h), the unique id shared over the
// strategy's Communicator (backend/nccl_unique_id.h).
#include "collective/device_group.h"

#include <vector>

#include "bootstrap/error_context.h"
#include "collective/backend/nccl_api.h"
#include "collective/backend/nccl_group.h"
#include "collective/backend/nccl_unique_id.h"
#include "mwms/errors.h"

namespace mwms::collective {

namespace {

class NcclDeviceGroup final : public DeviceGroup {
 public:
  explicit NcclDeviceGroup(std::unique_ptr<NcclReplicaGroup> group) : group_(std::move(group)) {}

  int device(int r) const noexcept override { return group_->device(r); }

  void all_reduce(const GroupTensor* tensors, std::size_t per_replica, void* const* streams,
                  ReduceOp op) override {
    run(DeviceCollective::kAllReduce, tensors, per_replica, streams, op);
  }
  void broadcast(const GroupTensor* tensors, std::size_t per_replica,
                 void* const* streams) override {
    run(DeviceCollective::kBroadcast, tensors, per_replica, streams, ReduceOp::kSum);
  }
  void finalize() override { group_->finalize(); }

 private:
  // In place, one NCCL group for every replica's tensors (Note [nccl replica group]).
  void run(DeviceCollective kind, const GroupTensor* tensors, std::size_t per_replica,
           void* const* streams, ReduceOp op) {
    if (per_replica == 0) return;
    const std::size_t total = per_replica * static_cast<std::size_t>(group_->size());
    calls_.clear();
    for (std::size_t i = 0; i < total; ++i) {
      const GroupTensor& t = tensors[i];
      calls_.push_back({kind, t.data, t.data, t.count, t.dtype, op, 0});
    }
    group_->launch(calls_.data(), per_replica, streams)->wait();
  }

  std::unique_ptr<NcclReplicaGroup> group_;
  std::vector<DeviceCall> calls_;  // capacity reused
};

}  // namespace

const NcclApi* default_nccl_api() noexcept { return real_nccl_api(); }

std::unique_ptr<DeviceGroup> DeviceGroup::create(const NcclApi* api, Communicator& comm,
                                                 const DeviceGroupOptions& options) {
  ErrorContext ctx = bootstrap::task_context(comm.cluster(), "GPU replicas");
  if (api == nullptr) {
    throw InvalidUsage(
        "ReplicaOptions::device = kGpu needs a build with NCCL (MWMS_WITH_CUDA=ON and NCCL "
        "found); this build has none: use ReplicaDevice::kCpu",
        ctx);
  }
  const NcclUniqueId id = share_unique_id(*api, comm, "worker 0", ctx);
  const int k = options.local_replicas;
  NcclGroupOptions o;
  o.first_rank = comm.rank() * k;
  o.world_size = comm.world_size() * k;
  for (int r = 0; r < k; ++r) o.devices.push_back(options.local_rank * k + r);
  o.timeout_seconds = options.timeout_seconds;
  o.init_timeout_seconds = options.init_timeout_seconds;
  o.context = ctx;
  o.context.op.clear();
  return std::make_unique<NcclDeviceGroup>(
      std::make_unique<NcclReplicaGroup>(*api, id, std::move(o)));
}

}  // namespace mwms::collective
