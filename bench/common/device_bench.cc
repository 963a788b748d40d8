// device_bench.h with NCCL: the device::Runtime of device_sweep.h over the CUDA runtime (buffers,
// stream, copies) and NCCL itself (raw NCCL for --compare nccl), and the public
// DeviceCommunicator for "ours"; never libmwms internals.
#include "common/device_bench.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "common/device_sweep.h"
#include "mwms/mwms.h"

namespace mwms::bench::device {
namespace {

using Clock = std::chrono::steady_clock;

void cuda_check(cudaError_t e, const char* call) {
  if (e != cudaSuccess) {
    throw BackendError(
        std::string(call) + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e),
        static_cast<int>(e));
  }
}

std::string nccl_text(ncclResult_t r, ncclComm_t comm) {
  std::string text = std::string(ncclGetErrorString(r)) + " (ncclResult_t " +
                     std::to_string(static_cast<int>(r)) + ")";
  if (comm != nullptr) {
    const char* last = ncclGetLastError(comm);
    if (last != nullptr && *last != '\0') text += ": " + std::string(last);
  }
  return text;
}

ncclDataType_t nccl_type(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32:
      return ncclFloat32;
    case DataType::kFloat64:
      return ncclFloat64;
    case DataType::kFloat16:
      return ncclFloat16;
    case DataType::kBFloat16:
      return ncclBfloat16;
    case DataType::kInt32:
      return ncclInt32;
    case DataType::kInt64:
      return ncclInt64;
  }
  throw InvalidArgument("raw NCCL: no NCCL type for dtype " + std::string(to_string(dtype)));
}

// kMean is ncclAvg for raw NCCL; ours sums and divides on the device (DeviceCommunicator's
// contract): the same traffic, one more elementwise pass.
ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kMean:
      return ncclAvg;
    case ReduceOp::kMin:
      return ncclMin;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kProd:
      return ncclProd;
  }
  throw InvalidArgument("raw NCCL: no NCCL op for " + std::string(to_string(op)));
}

// ---- The real Runtime (device_sweep.h) over the CUDA runtime and NCCL ----

void* device_alloc(std::size_t bytes) {
  void* p = nullptr;
  cuda_check(cudaMalloc(&p, bytes), "cudaMalloc");
  const cudaError_t e = cudaMemset(p, 0, bytes);
  if (e != cudaSuccess) {
    cudaFree(p);
    cuda_check(e, "cudaMemset");
  }
  return p;
}

void device_release(void* p) noexcept { cudaFree(p); }

// Non-blocking: nothing on the legacy default stream orders against it, so every copy is
// explicitly on it and synchronised.
void* stream_create() {
  cudaStream_t s = nullptr;
  cuda_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  return s;
}

void stream_destroy(void* s) noexcept { cudaStreamDestroy(static_cast<cudaStream_t>(s)); }

void copy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  cuda_check(cudaMemcpyAsync(dst, src, bytes, kind, s), "cudaMemcpyAsync");
  cuda_check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
}

void to_device(void* dst, const void* src, std::size_t bytes, void* stream) {
  copy(dst, src, bytes, cudaMemcpyHostToDevice, stream);
}

void to_host(void* dst, const void* src, std::size_t bytes, void* stream) {
  copy(dst, src, bytes, cudaMemcpyDeviceToHost, stream);
}

// Raw NCCL beside ours (--compare nccl): its own communicator on the same device, non-blocking
// so that its creation and every wait have a deadline (kRawNcclTimeoutSeconds), as ours have.
class RawNccl {
 public:
  RawNccl(DeviceCommunicator& ours, cudaStream_t stream) : stream_(stream) {
    ncclUniqueId id;
    std::memset(&id, 0, sizeof id);
    if (ours.rank() == 0) {
      const ncclResult_t r = ncclGetUniqueId(&id);
      if (r != ncclSuccess) throw BackendError("ncclGetUniqueId: " + nccl_text(r, nullptr), r);
    }
    // The unique id travels through libmwms (any launcher): rank 0's bytes broadcast on ours.
    static_assert(sizeof(ncclUniqueId) % sizeof(std::int32_t) == 0, "unique id in int32 words");
    void* id_buffer = device_alloc(sizeof id);
    try {
      to_device(id_buffer, &id, sizeof id, stream);
      ours.broadcast(id_buffer, sizeof id / sizeof(std::int32_t), DataType::kInt32, 0,
                     DeviceStream{stream});  // blocking
      to_host(&id, id_buffer, sizeof id, stream);
    } catch (...) {
      device_release(id_buffer);
      throw;
    }
    device_release(id_buffer);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t r =
        ncclCommInitRankConfig(&comm_, ours.world_size(), id, ours.rank(), &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      throw BackendError("ncclCommInitRankConfig (raw NCCL, rank " + std::to_string(ours.rank()) +
                             "): " + nccl_text(r, comm_),
                         r);
    }
    wait_ready("ncclCommInitRankConfig");
  }

  ~RawNccl() {
    if (comm_ == nullptr) return;
    // Non-blocking communicator: ncclCommFinalize completes through ncclCommGetAsyncError. Poll
    // it for a few seconds, then destroy; abort instead if it failed or did not finish.
    ncclResult_t state = ncclCommFinalize(comm_);
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (state == ncclInProgress || state == ncclSuccess) {
      if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) {
        state = ncclInternalError;
        break;
      }
      if (state != ncclInProgress || Clock::now() > deadline) break;
      std::this_thread::yield();
    }
    if (state == ncclSuccess) {
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);
    }
  }
  RawNccl(const RawNccl&) = delete;
  RawNccl& operator=(const RawNccl&) = delete;

  /// Enqueues `kind` in place on `buffer` (the host path's layout) on the stream.
  void enqueue(DeviceCollective kind, void* buffer, const CallShape& s, DataType dtype) {
    const std::size_t block = s.count * dtype_size(dtype);
    auto* bytes = static_cast<unsigned char*>(buffer);
    unsigned char* own = bytes + static_cast<std::size_t>(s.rank) * block;
    const ncclDataType_t t = nccl_type(dtype);
    ncclResult_t r = ncclSuccess;
    switch (kind) {
      case DeviceCollective::kAllReduce:
        r = ncclAllReduce(buffer, buffer, s.count, t, nccl_op(s.op), comm_, stream_);
        break;
      case DeviceCollective::kReduceScatter:
        r = ncclReduceScatter(buffer, own, s.count, t, nccl_op(s.op), comm_, stream_);
        break;
      case DeviceCollective::kAllGather:
        r = ncclAllGather(own, buffer, s.count, t, comm_, stream_);
        break;
      case DeviceCollective::kBroadcast:
        r = ncclBroadcast(buffer, buffer, s.count, t, s.root, comm_, stream_);
        break;
    }
    if (r == ncclInProgress) {
      wait_ready("raw NCCL enqueue");  // a non-blocking communicator may still be enqueueing
    } else if (r != ncclSuccess) {
      throw BackendError("raw NCCL collective: " + nccl_text(r, comm_), r);
    }
  }

  /// Waits until the stream is idle, polling NCCL's asynchronous error, under the deadline.
  void wait_stream() {
    const auto deadline = Clock::now() + seconds(kRawNcclTimeoutSeconds);
    for (;;) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) cuda_check(q, "cudaStreamQuery (raw NCCL)");
      check_async("raw NCCL collective");
      if (Clock::now() > deadline) abort_and_throw("raw NCCL collective");
      std::this_thread::yield();
    }
  }

 private:
  static Clock::duration seconds(double s) {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  }

  void check_async(const char* what) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
    if (r != ncclSuccess) throw BackendError(std::string(what) + ": " + nccl_text(r, comm_), r);
    if (state != ncclSuccess && state != ncclInProgress) {
      throw BackendError(std::string(what) + ": " + nccl_text(state, comm_), state);
    }
  }

  void wait_ready(const char* what) {
    const auto deadline = Clock::now() + seconds(kRawNcclTimeoutSeconds);
    for (;;) {
      ncclResult_t state = ncclInProgress;
      const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
      if (r != ncclSuccess) throw BackendError(std::string(what) + ": " + nccl_text(r, comm_), r);
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) {
        throw BackendError(std::string(what) + ": " + nccl_text(state, comm_), state);
      }
      if (Clock::now() > deadline) abort_and_throw(what);
      std::this_thread::yield();
    }
  }

  [[noreturn]] void abort_and_throw(const char* what) {
    ncclCommAbort(comm_);
    comm_ = nullptr;
    ErrorContext ctx;
    ctx.op = what;
    ctx.transport = "nccl (raw)";
    ctx.timeout_seconds = kRawNcclTimeoutSeconds;
    throw TimeoutError(std::string(what) + " did not complete within " +
                           std::to_string(static_cast<int>(kRawNcclTimeoutSeconds)) +
                           " s: a rank is dead, stalled or never joined; the raw NCCL "
                           "communicator was aborted",
                       ctx);
  }

  cudaStream_t stream_;
  ncclComm_t comm_ = nullptr;
};

void* raw_create(DeviceCommunicator& ours, void* stream) {
  return new RawNccl(ours, static_cast<cudaStream_t>(stream));
}

void raw_destroy(void* raw) noexcept { delete static_cast<RawNccl*>(raw); }

void raw_enqueue(void* raw, DeviceCollective kind, void* buffer, const CallShape& s, DataType dtype,
                 void* /*stream: the communicator's own*/) {
  static_cast<RawNccl*>(raw)->enqueue(kind, buffer, s, dtype);
}

void raw_wait(void* raw, void* /*stream*/) { static_cast<RawNccl*>(raw)->wait_stream(); }

const Runtime& real_runtime() {
  static const Runtime rt = [] {
    Runtime r;
    r.alloc = device_alloc;
    r.release = device_release;
    r.stream_create = stream_create;
    r.stream_destroy = stream_destroy;
    r.to_device = to_device;
    r.to_host = to_host;
    r.raw_create = raw_create;
    r.raw_destroy = raw_destroy;
    r.raw_enqueue = raw_enqueue;
    r.raw_wait = raw_wait;
    r.library = nccl_version;
    return r;
  }();
  return rt;
}

std::unique_ptr<DeviceCommunicator> make_communicator() {
  CommunicatorOptions options;
  options.implementation = Implementation::kNccl;  // NCCL, never a host-staged fallback
  return DeviceCommunicator::create(resolve_from_environment(), options);
}

}  // namespace

bool built_with_nccl() { return true; }

std::string no_device_reason() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    return std::string("cudaGetDeviceCount: ") + cudaGetErrorName(e) + ": " +
           cudaGetErrorString(e) +
           (e == cudaErrorInsufficientDriver ? " (no NVIDIA driver on this machine)" : "");
  }
  if (count <= 0) return "cudaGetDeviceCount: no CUDA device";
  return "";
}

std::string nccl_version() {
  int code = 0;
  if (ncclGetVersion(&code) != ncclSuccess) return "NCCL (version unknown)";
  return "NCCL " + std::to_string(code / 10000) + "." + std::to_string(code % 10000 / 100) + "." +
         std::to_string(code % 100);
}

int run_sweep(const CollectiveDescriptor& collective, const BenchOptions& options) {
  std::unique_ptr<DeviceCommunicator> comm = make_communicator();
  try {
    return sweep(collective, options, *comm, real_runtime());
  } catch (const std::exception& e) {
    comm->abort(e.what());  // peers blocked in a collective fail under their deadline
    throw;
  }
}

BucketRow run_buckets(const std::vector<std::size_t>& counts, const BucketOptions& options,
                      BucketRunInfo* info, bool* leader) {
  std::unique_ptr<DeviceCommunicator> comm = make_communicator();
  try {
    BucketRow row = buckets(counts, options, *comm, real_runtime(), info);
    *leader = comm->rank() == 0;
    return row;
  } catch (const std::exception& e) {
    comm->abort(e.what());
    throw;
  }
}

}  // namespace mwms::bench::device
