// The CUDA kernels of cuda_kernels.h: grid-stride loops applying the element functors of
// kernels/element_ops.h (Note [gpu bit identity]). Kept to one small file: nvcc compiles are slow.
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/element_ops.h"

namespace mwms::kernels::cuda {

namespace {

constexpr int kThreads = 256;
// Enough blocks to fill any current GPU (132 SMs x 16 resident blocks); grid-stride beyond.
constexpr std::size_t kMaxBlocks = 4096;

unsigned blocks_for(std::size_t count) {
  return static_cast<unsigned>(std::max<std::size_t>(
      1, std::min(kMaxBlocks, (count + kThreads - 1) / kThreads)));
}

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

template <typename F>
__global__ void reduce_kernel(typename F::Storage* dst, const typename F::Storage* src,
                              std::size_t count, F f) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < count;
       i += stride) {
    dst[i] = f(dst[i], src[i]);
  }
}

template <typename F>
__global__ void scale_kernel(typename F::Storage* buf, std::size_t count, F f) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < count;
       i += stride) {
    buf[i] = f(buf[i]);
  }
}

// kToHalf/kToBFloat16 narrow, kFromHalf/kFromBFloat16 widen.
enum class Cast { kToHalf, kToBFloat16, kFromHalf, kFromBFloat16 };

template <Cast C, typename In, typename Out>
__global__ void cast_kernel(Out* dst, const In* src, std::size_t count) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < count;
       i += stride) {
    if constexpr (C == Cast::kToHalf) dst[i] = ops::float_to_half(src[i]);
    if constexpr (C == Cast::kToBFloat16) dst[i] = ops::float_to_bfloat16(src[i]);
    if constexpr (C == Cast::kFromHalf) dst[i] = ops::half_to_float(src[i]);
    if constexpr (C == Cast::kFromBFloat16) dst[i] = ops::bfloat16_to_float(src[i]);
  }
}

// Up to kBatch tensors per launch, passed by value (well under the 4 KiB parameter limit);
// blockIdx.y picks the tensor. A tensor whose addresses and size are 16-byte multiples moves in
// uint4 words, any other byte by byte.
constexpr std::size_t kBatch = 64;
struct PackBatch {
  PackEntry entries[kBatch];
  unsigned count;
};

template <bool kPack>
__global__ void pack_kernel(char* bucket, PackBatch batch) {
  const PackEntry e = batch.entries[blockIdx.y];
  char* tensor = static_cast<char*>(e.tensor);
  char* to = kPack ? bucket + e.offset : tensor;
  const char* from = kPack ? tensor : bucket + e.offset;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t first = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  const auto bits = reinterpret_cast<std::uintptr_t>(to) | reinterpret_cast<std::uintptr_t>(from) |
                    static_cast<std::uintptr_t>(e.bytes);
  if ((bits & 15u) == 0) {
    const std::size_t words = e.bytes / 16;
    for (std::size_t i = first; i < words; i += stride) {
      reinterpret_cast<uint4*>(to)[i] = reinterpret_cast<const uint4*>(from)[i];
    }
  } else {
    for (std::size_t i = first; i < e.bytes; i += stride) to[i] = from[i];
  }
}

template <bool kPack>
int pack_any(char* bucket, const PackEntry* entries, std::size_t n, void* stream) {
  for (std::size_t first = 0; first < n; first += kBatch) {
    PackBatch batch{};
    batch.count = static_cast<unsigned>(std::min(kBatch, n - first));
    std::size_t largest = 0;
    for (unsigned i = 0; i < batch.count; ++i) {
      batch.entries[i] = entries[first + i];
      largest = std::max(largest, batch.entries[i].bytes);
    }
    if (largest == 0) continue;
    dim3 grid(std::min<unsigned>(blocks_for(largest / 16 + 1), 512), batch.count);
    pack_kernel<kPack><<<grid, kThreads, 0, as_stream(stream)>>>(bucket, batch);
    if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace

int reduce(void* dst, const void* src, std::size_t count, DataType dtype, ReduceOp op,
           void* stream) noexcept {
  if (count == 0) return cudaSuccess;
  ops::with_reduce_functor(dtype, op, [&](auto f) {
    using T = typename decltype(f)::Storage;
    reduce_kernel<<<blocks_for(count), kThreads, 0, as_stream(stream)>>>(
        static_cast<T*>(dst), static_cast<const T*>(src), count, f);
  });
  return cudaGetLastError();
}

int scale_divide(void* buffer, std::size_t count, DataType dtype, int divisor,
                 void* stream) noexcept {
  if (count == 0 || ops::scale_is_identity(divisor)) return cudaSuccess;
  ops::with_scale_functor(dtype, divisor, [&](auto f) {
    using T = typename decltype(f)::Storage;
    scale_kernel<<<blocks_for(count), kThreads, 0, as_stream(stream)>>>(static_cast<T*>(buffer),
                                                                         count, f);
  });
  return cudaGetLastError();
}

int float32_to_16(std::uint16_t* dst, const float* src, std::size_t count, DataType to,
                  void* stream) noexcept {
  if (count == 0) return cudaSuccess;
  if (to == DataType::kBFloat16) {
    cast_kernel<Cast::kToBFloat16><<<blocks_for(count), kThreads, 0, as_stream(stream)>>>(
        dst, src, count);
  } else {
    cast_kernel<Cast::kToHalf><<<blocks_for(count), kThreads, 0, as_stream(stream)>>>(dst, src,
                                                                                     count);
  }
  return cudaGetLastError();
}

int float16_to_32(float* dst, const std::uint16_t* src, std::size_t count, DataType from,
                  void* stream) noexcept {
  if (count == 0) return cudaSuccess;
  if (from == DataType::kBFloat16) {
    cast_kernel<Cast::kFromBFloat16><<<blocks_for(count), kThreads, 0, as_stream(stream)>>>(
        dst, src, count);
  } else {
    cast_kernel<Cast::kFromHalf><<<blocks_for(count), kThreads, 0, as_stream(stream)>>>(dst, src,
                                                                                       count);
  }
  return cudaGetLastError();
}

int pack(void* bucket, const PackEntry* entries, std::size_t num_entries, void* stream) noexcept {
  return pack_any<true>(static_cast<char*>(bucket), entries, num_entries, stream);
}

int unpack(const void* bucket, const PackEntry* entries, std::size_t num_entries,
           void* stream) noexcept {
  return pack_any<false>(const_cast<char*>(static_cast<const char*>(bucket)), entries, num_entries,
                         stream);
}

}  // namespace mwms::kernels::cuda
