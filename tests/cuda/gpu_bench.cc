// mwms_gpu_bench: timings for scripts/gpu_check.sh on a GPU machine (not a ctest).
//   kernels: the CUDA reduce (float32 sum, bfloat16 sum), scale and casts from 1 MiB to
//            --max-bytes, timed with CUDA events; GB/s counts the bytes each kernel moves
//            (reduce: reads dst and src, writes dst = 3 x bytes).
//   nccl:    one-rank NCCL all-reduce through the NCCL backend (launch + Work::wait), 8 B to
//            --max-bytes: what our launch/wait path costs around NCCL on one device. NCCL refuses
//            two ranks on one GPU, so busbw across ranks needs a multi-GPU machine.
// Prints one JSON object per line. Usage: mwms_gpu_bench [--max-bytes N] [--iters N]
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "collective/backend/nccl_backend.h"
#include "kernels/cuda/cuda_kernels.h"

namespace {

namespace cu = mwms::kernels::cuda;
namespace mc = mwms::collective;
using mwms::DataType;
using mwms::ReduceOp;

template <typename F>
double time_us(int iters, F launch) {
  cudaEvent_t start, stop;
  cu::check(cudaEventCreate(&start), "cudaEventCreate");
  cu::check(cudaEventCreate(&stop), "cudaEventCreate");
  launch();  // warm-up
  cu::check(cudaEventRecord(start), "cudaEventRecord");
  for (int i = 0; i < iters; ++i) launch();
  cu::check(cudaEventRecord(stop), "cudaEventRecord");
  cu::check(cudaEventSynchronize(stop), "cudaEventSynchronize");
  float ms = 0;
  cu::check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms * 1000.0 / iters;
}

void line(const char* what, const char* dtype, std::size_t bytes, double us, double moved) {
  std::printf("{\"bench\":\"%s\",\"dtype\":\"%s\",\"bytes\":%zu,\"time_us\":%.3f,\"GBps\":%.2f}\n",
              what, dtype, bytes, us, moved / (us * 1e3));
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t max_bytes = std::size_t{1} << 30;
  int iters = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--max-bytes") == 0) max_bytes = std::strtoull(argv[i + 1], nullptr, 10);
    if (std::strcmp(argv[i], "--iters") == 0) iters = std::atoi(argv[i + 1]);
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("SKIPPED: no CUDA device\n");
    return 77;
  }
  try {
    void *a = nullptr, *b = nullptr, *h = nullptr;
    cu::check(cudaMalloc(&a, max_bytes), "cudaMalloc");
    cu::check(cudaMalloc(&b, max_bytes), "cudaMalloc");
    cu::check(cudaMalloc(&h, max_bytes / 2 + 2), "cudaMalloc");
    cu::check(cudaMemset(a, 0, max_bytes), "cudaMemset");
    cu::check(cudaMemset(b, 0, max_bytes), "cudaMemset");
    for (std::size_t bytes = std::size_t{1} << 20; bytes <= max_bytes; bytes *= 4) {
      line("reduce_sum", "float32", bytes, time_us(iters, [&] {
             cu::check(cu::reduce(a, b, bytes / 4, DataType::kFloat32, ReduceOp::kSum, nullptr), "reduce");
           }), 3.0 * bytes);
      line("reduce_sum", "bfloat16", bytes, time_us(iters, [&] {
             cu::check(cu::reduce(a, b, bytes / 2, DataType::kBFloat16, ReduceOp::kSum, nullptr), "reduce");
           }), 3.0 * bytes);
      line("scale_divide", "float32", bytes, time_us(iters, [&] {
             cu::check(cu::scale_divide(a, bytes / 4, DataType::kFloat32, 3, nullptr), "scale");
           }), 2.0 * bytes);
      line("cast_to_16", "bfloat16", bytes, time_us(iters, [&] {
             cu::check(cu::float32_to_16(static_cast<std::uint16_t*>(h), static_cast<float*>(a),
                                         bytes / 4, DataType::kBFloat16, nullptr), "cast");
           }), 1.5 * bytes);
    }
    const mc::NcclApi* api = mc::real_nccl_api();
    mc::NcclUniqueId id;
    cu::check(api->get_unique_id(&id) == 0 ? 0 : 1, "ncclGetUniqueId");
    mc::NcclBackendOptions o;
    o.timeout_seconds = 60;
    mc::NcclBackend backend(*api, id, o);
    for (std::size_t bytes = 8; bytes <= max_bytes; bytes *= 4) {
      mc::DeviceCall c{mc::DeviceCollective::kAllReduce, a, a, bytes / 4, DataType::kFloat32,
                       ReduceOp::kSum, 0};
      backend.launch(&c, 1, nullptr)->wait();
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) backend.launch(&c, 1, nullptr)->wait();
      const double us = std::chrono::duration<double, std::micro>(
                            std::chrono::steady_clock::now() - start).count() / iters;
      line("nccl_all_reduce_1rank", "float32", bytes, us, static_cast<double>(bytes));
    }
    cudaFree(a);
    cudaFree(b);
    cudaFree(h);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mwms_gpu_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
