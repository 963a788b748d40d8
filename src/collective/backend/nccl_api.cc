// The real NcclApi: NCCL 2.14+ (ncclCommInitRankConfig, non-blocking communicators) and the CUDA
// runtime. Built only with MWMS_WITH_CUDA (CMake picks this file or nccl_api_none.cc).
#include "collective/backend/nccl_api.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>

#include "kernels/cuda/cuda_kernels.h"

static_assert(sizeof(ncclUniqueId) == sizeof(mwms::collective::NcclUniqueId),
              "NCCL_UNIQUE_ID_BYTES changed");
static_assert(int{ncclInProgress} == mwms::collective::kNcclInProgress &&
                  int{ncclRemoteError} == mwms::collective::kNcclRemoteError &&
                  int{ncclSystemError} == mwms::collective::kNcclSystemError &&
                  int{ncclInvalidArgument} == mwms::collective::kNcclInvalidArgument,
              "ncclResult_t values changed");
static_assert(int{cudaErrorNotReady} == mwms::collective::kCudaErrorNotReady, "cudaErrorNotReady");

namespace mwms::collective {

namespace {

ncclDataType_t to_nccl(DataType t) {
  switch (t) {
    case DataType::kFloat32: return ncclFloat32;
    case DataType::kFloat64: return ncclFloat64;
    case DataType::kFloat16: return ncclFloat16;
    case DataType::kBFloat16: return ncclBfloat16;
    case DataType::kInt32: return ncclInt32;
    case DataType::kInt64: return ncclInt64;
  }
  return ncclFloat32;
}

// kMean is summed here; the backend divides afterwards with the CPU path's rounding.
ncclRedOp_t to_nccl(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kMean: return ncclSum;
    case ReduceOp::kProd: return ncclProd;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kMax: return ncclMax;
  }
  return ncclSum;
}

ncclComm_t comm_of(NcclComm c) { return static_cast<ncclComm_t>(c); }
cudaStream_t stream_of(void* s) { return static_cast<cudaStream_t>(s); }

int get_unique_id(NcclUniqueId* id) {
  ncclUniqueId raw;
  const ncclResult_t r = ncclGetUniqueId(&raw);
  std::memcpy(id->bytes.data(), &raw, sizeof raw);
  return r;
}

int comm_init_rank(NcclComm* comm, int world_size, const NcclUniqueId* id, int rank) {
  ncclUniqueId raw;
  std::memcpy(&raw, id->bytes.data(), sizeof raw);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every wait is ours, with a deadline (Note [nccl deadlines])
  ncclComm_t c = nullptr;
  const ncclResult_t r = ncclCommInitRankConfig(&c, world_size, raw, rank, &config);
  *comm = c;
  return r;
}

int comm_get_async_error(NcclComm comm, int* async_error) {
  ncclResult_t e = ncclSuccess;
  const ncclResult_t r = ncclCommGetAsyncError(comm_of(comm), &e);
  *async_error = e;
  return r;
}

int comm_abort(NcclComm comm) { return ncclCommAbort(comm_of(comm)); }

int comm_finalize(NcclComm comm) { return ncclCommFinalize(comm_of(comm)); }
int comm_destroy(NcclComm comm) { return ncclCommDestroy(comm_of(comm)); }

int group_start() { return ncclGroupStart(); }
int group_end() { return ncclGroupEnd(); }

int all_reduce(const void* send, void* recv, std::size_t count, DataType dtype, ReduceOp op,
               NcclComm comm, void* stream) {
  return ncclAllReduce(send, recv, count, to_nccl(dtype), to_nccl(op), comm_of(comm),
                       stream_of(stream));
}

int reduce_scatter(const void* send, void* recv, std::size_t recv_count, DataType dtype,
                   ReduceOp op, NcclComm comm, void* stream) {
  return ncclReduceScatter(send, recv, recv_count, to_nccl(dtype), to_nccl(op), comm_of(comm),
                           stream_of(stream));
}

int all_gather(const void* send, void* recv, std::size_t send_count, DataType dtype,
               NcclComm comm, void* stream) {
  return ncclAllGather(send, recv, send_count, to_nccl(dtype), comm_of(comm), stream_of(stream));
}

int broadcast(const void* send, void* recv, std::size_t count, DataType dtype, int root,
              NcclComm comm, void* stream) {
  return ncclBroadcast(send, recv, count, to_nccl(dtype), root, comm_of(comm), stream_of(stream));
}

const char* error_string(int result) {
  return ncclGetErrorString(static_cast<ncclResult_t>(result));
}

const char* last_error(NcclComm comm) { return ncclGetLastError(comm_of(comm)); }

int set_device(int local_rank, int* device) {
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) return e;
  if (count <= 0) return cudaErrorNoDevice;
  *device = local_rank % count;
  return cudaSetDevice(*device);
}

int event_create(NcclEvent* event) {
  cudaEvent_t e = nullptr;
  const cudaError_t r = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
  *event = e;
  return r;
}

int event_record(NcclEvent event, void* stream) {
  return cudaEventRecord(static_cast<cudaEvent_t>(event), stream_of(stream));
}

int event_query(NcclEvent event) { return cudaEventQuery(static_cast<cudaEvent_t>(event)); }

int event_destroy(NcclEvent event) { return cudaEventDestroy(static_cast<cudaEvent_t>(event)); }

int malloc_device(void** ptr, std::size_t bytes) { return cudaMalloc(ptr, bytes); }

int free_device(void* ptr) { return cudaFree(ptr); }

int scale_divide(void* buffer, std::size_t count, DataType dtype, int divisor, void* stream) {
  return kernels::cuda::scale_divide(buffer, count, dtype, divisor, stream);
}

const char* cuda_error_string(int code) {
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}

NcclApi make_real() {
  NcclApi api;
  api.name = "nccl";
  api.get_unique_id = get_unique_id;
  api.comm_init_rank = comm_init_rank;
  api.comm_get_async_error = comm_get_async_error;
  api.comm_abort = comm_abort;
  api.comm_finalize = comm_finalize;
  api.comm_destroy = comm_destroy;
  api.group_start = group_start;
  api.group_end = group_end;
  api.all_reduce = all_reduce;
  api.reduce_scatter = reduce_scatter;
  api.all_gather = all_gather;
  api.broadcast = broadcast;
  api.error_string = error_string;
  api.last_error = last_error;
  api.set_device = set_device;
  api.event_create = event_create;
  api.event_record = event_record;
  api.event_query = event_query;
  api.event_destroy = event_destroy;
  api.malloc_device = malloc_device;
  api.free_device = free_device;
  api.scale_divide = scale_divide;
  api.cuda_error_string = cuda_error_string;
  return api;
}

}  // namespace

const NcclApi* real_nccl_api() noexcept {
  static const NcclApi api = make_real();
  return &api;
}

}  // namespace mwms::collective
