// mwms_gpu_bench: timings for scripts/gpu_check.sh on a GPU machine (not a ctest).
//   kernels: the CUDA reduce (float32 sum, bfloat16 sum), scale and casts from 1 MiB to
//            --max-bytes, timed with CUDA events; GB/s counts the bytes each kernel moves
//            (reduce: reads dst and src, writes dst = 3 x bytes).
//   nccl:    one-rank NCCL all-reduce through the NCCL backend (launch + Work::wait), 8 B to
//            --max-bytes: what our launch/wait path costs around NCCL on one device. NCCL refuses
//            two ranks on one GPU, so busbw across ranks needs a multi-GPU machine.
// Each kernel beside a device-to-device cudaMemcpy of the same size (vs_copy). Prints one JSON
// object per line. Usage: mwms_gpu_bench [--max-bytes N] [--iters N] (--help: kUsage below).
#include <cuda_runtime.h>

#include <algorithm>
#include <cerrno>
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

// One JSON line; `copy_gbps` > 0 adds the kernel's bandwidth as a fraction of the device copy's
// measured at the same size just before (the target: reduce >= 0.9 at >= 64 MiB).
double line(const char* what, const char* dtype, std::size_t bytes, double us, double moved,
            double copy_gbps = 0) {
  const double gbps = moved / (us * 1e3);
  std::printf("{\"bench\":\"%s\",\"dtype\":\"%s\",\"bytes\":%zu,\"time_us\":%.3f,\"GBps\":%.2f",
              what, dtype, bytes, us, gbps);
  if (copy_gbps > 0) std::printf(",\"vs_copy\":%.3f", gbps / copy_gbps);
  std::printf("}\n");
  std::fflush(stdout);
  return gbps;
}

constexpr const char* kUsage =
    "usage: mwms_gpu_bench [--max-bytes N] [--iters N]\n"
    "  CUDA kernels (reduce float32/bfloat16 sum, scale, cast) from 1 MiB to --max-bytes\n"
    "  (default 1073741824), each beside a device-to-device cudaMemcpy of the same size timed just\n"
    "  before it (vs_copy: the kernel's GB/s over the copy's, both counting the bytes each moves),\n"
    "  then a one-rank NCCL all-reduce through the NCCL backend from 8 B; --iters timed launches\n"
    "  per point (default 20). One JSON object per line; the last one summarises reduce vs copy\n"
    "  at >= 64 MiB. Exit 0; 77 without a CUDA device; 2 on a bad argument; 1 on a CUDA error.\n";

// A positive integer argument, or exit 2 naming the flag.
unsigned long long positive(const char* flag, const char* text) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(text, &end, 10);
  if (*text == '\0' || *text == '-' || end == nullptr || *end != '\0' || errno == ERANGE || v == 0) {
    std::fprintf(stderr, "mwms_gpu_bench: %s %s: not a positive integer\n%s", flag, text, kUsage);
    std::exit(2);
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t max_bytes = std::size_t{1} << 30;
  int iters = 20;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::printf("%s", kUsage);
      return 0;
    }
    if ((arg == "--max-bytes" || arg == "--iters") && i + 1 < argc) {
      const unsigned long long v = positive(argv[i], argv[i + 1]);
      if (arg == "--max-bytes") {
        max_bytes = static_cast<std::size_t>(v);
      } else {
        iters = static_cast<int>(std::min<unsigned long long>(v, 100000));
      }
      ++i;
      continue;
    }
    std::fprintf(stderr, "mwms_gpu_bench: unknown or incomplete argument '%s'\n%s", argv[i], kUsage);
    return 2;
  }
  if (max_bytes < (std::size_t{1} << 20)) {
    std::fprintf(stderr, "mwms_gpu_bench: --max-bytes %zu is below the first size, 1 MiB\n%s",
                 max_bytes, kUsage);
    return 2;
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
    double worst_reduce_vs_copy = 0;  // over sizes >= 64 MiB
    for (std::size_t bytes = std::size_t{1} << 20; bytes <= max_bytes; bytes *= 4) {
      // The copy reads and writes `bytes`: 2 x bytes moved, counted as the kernels count theirs.
      const double copy = line("memcpy_d2d", "bytes", bytes, time_us(iters, [&] {
                                 cu::check(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice,
                                                           nullptr), "cudaMemcpyAsync");
                               }), 2.0 * bytes);
      const double f32 = line("reduce_sum", "float32", bytes, time_us(iters, [&] {
             cu::check(cu::reduce(a, b, bytes / 4, DataType::kFloat32, ReduceOp::kSum, nullptr), "reduce");
           }), 3.0 * bytes, copy);
      const double b16 = line("reduce_sum", "bfloat16", bytes, time_us(iters, [&] {
             cu::check(cu::reduce(a, b, bytes / 2, DataType::kBFloat16, ReduceOp::kSum, nullptr), "reduce");
           }), 3.0 * bytes, copy);
      line("scale_divide", "float32", bytes, time_us(iters, [&] {
             cu::check(cu::scale_divide(a, bytes / 4, DataType::kFloat32, 3, nullptr), "scale");
           }), 2.0 * bytes, copy);
      line("cast_to_16", "bfloat16", bytes, time_us(iters, [&] {
             cu::check(cu::float32_to_16(static_cast<std::uint16_t*>(h), static_cast<float*>(a),
                                         bytes / 4, DataType::kBFloat16, nullptr), "cast");
           }), 1.5 * bytes, copy);
      if (bytes >= (std::size_t{64} << 20)) {
        const double r = std::min(f32, b16) / copy;
        worst_reduce_vs_copy = worst_reduce_vs_copy == 0 ? r : std::min(worst_reduce_vs_copy, r);
      }
    }
    if (worst_reduce_vs_copy > 0) {
      std::printf("{\"bench\":\"summary\",\"reduce_vs_copy_min_64M_plus\":%.3f,\"target\":0.9}\n",
                  worst_reduce_vs_copy);
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
