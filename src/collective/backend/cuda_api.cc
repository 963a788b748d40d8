// The real CudaApi over libcudart (runtime API only: never libcuda, unit:no-libcuda). Built only
// with MWMS_WITH_CUDA (CMake picks this file or cuda_api_none.cc).
#include "collective/backend/cuda_api.h"

#include <cuda_runtime.h>

static_assert(int{cudaErrorNotReady} == mwms::collective::kCudaNotReady, "cudaErrorNotReady");
static_assert(int{cudaMemcpyHostToDevice} ==
                      static_cast<int>(mwms::collective::CudaCopy::kHostToDevice) &&
                  int{cudaMemcpyDeviceToHost} ==
                      static_cast<int>(mwms::collective::CudaCopy::kDeviceToHost),
              "cudaMemcpyKind values changed");

namespace mwms::collective {

namespace {

cudaStream_t stream_of(void* s) { return static_cast<cudaStream_t>(s); }

int get_device_count(int* count) {
  *count = 0;  // cudaGetDeviceCount leaves it untouched without a driver
  return cudaGetDeviceCount(count);
}

int set_device(int device) { return cudaSetDevice(device); }

int malloc_host(void** ptr, std::size_t bytes) { return cudaMallocHost(ptr, bytes); }

int free_host(void* ptr) { return cudaFreeHost(ptr); }

int memcpy_async(void* dst, const void* src, std::size_t bytes, CudaCopy kind, void* stream) {
  return cudaMemcpyAsync(dst, src, bytes, static_cast<cudaMemcpyKind>(kind), stream_of(stream));
}

int stream_synchronize(void* stream) { return cudaStreamSynchronize(stream_of(stream)); }

int event_create(CudaEvent* event) {
  cudaEvent_t e = nullptr;
  const cudaError_t r = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
  *event = e;
  return r;
}

int event_record(CudaEvent event, void* stream) {
  return cudaEventRecord(static_cast<cudaEvent_t>(event), stream_of(stream));
}

int event_query(CudaEvent event) { return cudaEventQuery(static_cast<cudaEvent_t>(event)); }

int event_destroy(CudaEvent event) { return cudaEventDestroy(static_cast<cudaEvent_t>(event)); }

int pointer_is_device(const void* ptr, int* is_device) {
  cudaPointerAttributes attr{};
  const cudaError_t r = cudaPointerGetAttributes(&attr, ptr);
  if (r != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: keep it from surfacing in an unrelated call
    *is_device = 0;
    return r;
  }
  *is_device = attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged ? 1 : 0;
  return cudaSuccess;
}

const char* error_string(int code) { return cudaGetErrorString(static_cast<cudaError_t>(code)); }

CudaApi make_real() {
  CudaApi api;
  api.name = "cuda";
  api.get_device_count = get_device_count;
  api.set_device = set_device;
  api.malloc_host = malloc_host;
  api.free_host = free_host;
  api.memcpy_async = memcpy_async;
  api.stream_synchronize = stream_synchronize;
  api.event_create = event_create;
  api.event_record = event_record;
  api.event_query = event_query;
  api.event_destroy = event_destroy;
  api.pointer_is_device = pointer_is_device;
  api.error_string = error_string;
  return api;
}

}  // namespace

const CudaApi* real_cuda_api() noexcept {
  static const CudaApi api = make_real();
  return &api;
}

}  // namespace mwms::collective
