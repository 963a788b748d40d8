// NcclBackend: the K = 1 NCCL replica group behind DeviceCommunicator, and the barrier.
#include "collective/backend/nccl_backend.h"

#include "common/logging.h"

namespace mwms::collective {

namespace {

NcclGroupOptions group_options(NcclBackendOptions o) {
  NcclGroupOptions g;
  g.first_rank = o.rank;
  g.world_size = o.world_size;
  g.devices = {o.local_rank};
  g.timeout_seconds = o.timeout_seconds;
  g.init_timeout_seconds = o.init_timeout_seconds;
  g.context = std::move(o.context);
  g.context.rank = o.rank;
  g.context.world_size = o.world_size;
  g.role = NcclGroupRole::kRank;
  return g;
}

}  // namespace

const char* to_string(DeviceCollective kind) noexcept {
  switch (kind) {
    case DeviceCollective::kAllReduce: return "all_reduce";
    case DeviceCollective::kReduceScatter: return "reduce_scatter";
    case DeviceCollective::kAllGather: return "all_gather";
    case DeviceCollective::kBroadcast: return "broadcast";
  }
  return "?";
}

NcclBackend::NcclBackend(const NcclApi& api, const NcclUniqueId& id, NcclBackendOptions options)
    : api_(api),
      local_rank_(options.local_rank),
      group_(std::make_unique<NcclReplicaGroup>(api, id, group_options(std::move(options)))) {}

NcclBackend::~NcclBackend() {
  group_.reset();  // waits for the last collective, then finalizes (or aborts) the communicator
  free_scratch();
}

void NcclBackend::free_scratch() noexcept {
  if (scratch_ == nullptr) return;
  int device = -1;
  api_.set_device(local_rank_, &device);  // cudaFree on our device
  const int r = api_.free_device(scratch_);
  if (r != kCudaSuccess) {
    const char* text = api_.cuda_error_string(r);
    MWMS_LOG_WARN(kColl, "nccl: cudaFree of the barrier buffer returned "
                             << r << " (" << (text ? text : "") << ")");
  }
  scratch_ = nullptr;
}

std::shared_ptr<Work> NcclBackend::launch(const DeviceCall* calls, std::size_t num_calls,
                                          void* stream) {
  // K = 1: the group's "per replica" calls are all of them, on the one stream.
  return group_->launch(calls, num_calls, &stream);
}

void NcclBackend::barrier(void* stream) {
  const ErrorContext ctx = group_->context("barrier", static_cast<std::int64_t>(seq()));
  group_->throw_if_unusable(ctx);
  if (scratch_ == nullptr) {  // Note [nccl barrier]
    group_->set_device(0, ctx);
    const int r = api_.malloc_device(&scratch_, sizeof(std::int32_t));
    if (r != kCudaSuccess) {
      scratch_ = nullptr;
      std::rethrow_exception(to_error(api_, NativeSource::kCuda, r,
                                      "cudaMalloc (the barrier's 4 bytes)", nullptr, ctx));
    }
  }
  const DeviceCall call{DeviceCollective::kAllReduce, scratch_, scratch_, 1, DataType::kInt32,
                        ReduceOp::kMax, 0};
  group_->launch(&call, 1, &stream, "barrier")->wait();
}

void NcclBackend::finalize() {
  try {
    group_->finalize();
  } catch (...) {
    if (group_->released()) free_scratch();  // else the destructor frees it, once it is safe
    throw;
  }
  free_scratch();
}

}  // namespace mwms::collective
