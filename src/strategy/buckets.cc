// The bucket plan (plan_buckets: which tensors share a pack) and the helpers the strategy's
// blocking and overlapped paths build on it.
#include "strategy/buckets.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/reduce.h"

namespace mwms::strategy {

bool adjacent_tensors(const TensorRef& a, const TensorRef& b) noexcept {
  return static_cast<const char*>(a.data) + a.count * dtype_size(a.dtype) == b.data;
}

std::vector<BucketSpan> plan_buckets(const std::vector<TensorRef>& tensors,
                                     std::size_t bytes_per_pack, std::size_t solo_bytes) {
  std::vector<BucketSpan> out;
  std::size_t first = 0;
  while (first < tensors.size()) {
    std::size_t last = first + 1;
    std::size_t bytes = tensors[first].count * dtype_size(tensors[first].dtype);
    while (last < tensors.size() && tensors[last].dtype == tensors[first].dtype) {
      const std::size_t more = tensors[last].count * dtype_size(tensors[last].dtype);
      if (bytes + more > bytes_per_pack) break;
      if ((bytes >= solo_bytes || more >= solo_bytes) &&
          !adjacent_tensors(tensors[last - 1], tensors[last])) {
        break;
      }
      bytes += more;
      ++last;
    }
    out.push_back({first, last, bytes});
    first = last;
  }
  return out;
}

// Note [solo tensors]: packing a tensor costs a copy in and a copy out (2 x its bytes of memory
// traffic on each worker, at memcpy speed) to save one collective's fixed cost (a few
// microseconds over shm, tens over TCP). For small tensors the collective's cost wins and they
// are packed; from kSoloBytes on the copies cost more, so such a tensor is all-reduced alone,
// where it lies (TF packs every gradient; Horovod copies every tensor into its fusion buffer).
// bench/bucket_perf (200 CNN-shaped tensors of 256 B - 1 MiB, 25 MiB in all, 4 MiB packs, n = 2
// on one quiet 2-core host), buckets' time relative to one all-reduce per tensor: packing
// everything 0.53-0.63x over shm and 0.53-0.65x over TCP; with 256 KiB solo tensors 0.94-0.95x
// and 1.08-1.09x (64 KiB: 0.89-0.99x over shm); the same 200 tensors in 1 MiB in all (none solo)
// stay at 1.4-1.6x. With compression every float32 tensor must be converted anyway, so nothing
// is solo then.
std::size_t solo_bytes(const CommunicationOptions& options) noexcept {
  if (options.compression != Compression::kNone) return static_cast<std::size_t>(-1);
  return kSoloBytes;
}

// Note [compression]: with CommunicationOptions::compression, a float32 bucket is converted
// into 16-bit values in a pack buffer, all-reduced in that type (the kernels sum float16 and
// bfloat16 in float32 and round once per step, so every rank gets the same bits) and converted
// back: half the bytes on the wire, two conversions per element on each worker (Horovod's
// Compression.fp16 does the same).
DataType wire_type(Compression c, DataType dtype) noexcept {
  if (c == Compression::kNone || dtype != DataType::kFloat32) return dtype;
  return c == Compression::kFloat16 ? DataType::kFloat16 : DataType::kBFloat16;
}

void pack_tensors(const std::vector<TensorRef>& t, std::size_t first, std::size_t last,
                  DataType wire, char* dst) {
  for (std::size_t i = first; i < last; ++i) {
    if (wire != t[i].dtype) {
      kernels::float32_to_16(reinterpret_cast<std::uint16_t*>(dst),
                             static_cast<const float*>(t[i].data), t[i].count, wire);
    } else if (t[i].count > 0) {
      std::memcpy(dst, t[i].data, t[i].count * dtype_size(wire));
    }
    dst += t[i].count * dtype_size(wire);
  }
}

void unpack_tensors(const std::vector<TensorRef>& t, std::size_t first, std::size_t last,
                    DataType wire, const char* src) {
  for (std::size_t i = first; i < last; ++i) {
    if (wire != t[i].dtype) {
      kernels::float16_to_32(static_cast<float*>(t[i].data),
                             reinterpret_cast<const std::uint16_t*>(src), t[i].count, wire);
    } else if (t[i].count > 0) {
      std::memcpy(t[i].data, src, t[i].count * dtype_size(wire));
    }
    src += t[i].count * dtype_size(wire);
  }
}

bool contiguous_tensors(const std::vector<TensorRef>& t, std::size_t first,
                        std::size_t last) noexcept {
  for (std::size_t i = first + 1; i < last; ++i) {
    if (!adjacent_tensors(t[i - 1], t[i])) return false;
  }
  return true;
}

void bucketed_all_reduce(Communicator& comm, const CommunicationOptions& options,
                         std::vector<char>& pack, const std::vector<TensorRef>& gradients,
                         ReduceOp op) {
  for_each_bucket(gradients, options.bytes_per_pack.value_or(0), solo_bytes(options),
                  [&](std::size_t first, std::size_t last, std::size_t bytes) {
                    const DataType dtype = gradients[first].dtype;
                    const std::size_t elems = bytes / dtype_size(dtype);
                    const DataType wire = wire_type(options.compression, dtype);
                    if (wire == dtype && contiguous_tensors(gradients, first, last)) {
                      comm.all_reduce(gradients[first].data, elems, dtype, op);
                      return;
                    }
                    if (wire == dtype && comm.world_size() == 1) {
                      // A world of one: every all-reduce is the identity, so packing would
                      // only copy the bucket twice; each tensor in place instead (the
                      // communicator's checks still run).
                      for (std::size_t i = first; i < last; ++i) {
                        comm.all_reduce(gradients[i].data, gradients[i].count, dtype, op);
                      }
                      return;
                    }
                    const std::size_t wire_bytes = elems * dtype_size(wire);
                    if (pack.size() < wire_bytes)
                      pack.resize(std::max(wire_bytes, options.bytes_per_pack.value_or(0)));
                    pack_tensors(gradients, first, last, wire, pack.data());
                    comm.all_reduce(pack.data(), elems, wire, op);
                    unpack_tensors(gradients, first, last, wire, pack.data());
                  });
}

}  // namespace mwms::strategy
