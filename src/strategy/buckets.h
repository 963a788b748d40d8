// How the strategy cuts a gradient list into buckets (packs), shared by the blocking and the
// overlapped paths (multi_worker_mirrored_strategy.cc, overlap.cc, replica_overlap.cc), so that
// every worker, given the same list, issues the same all-reduces; and the bucket helpers of those
// paths: the wire type of compression, packing and unpacking, and the blocking bucketed
// all-reduce.
#pragma once

#include <cstddef>
#include <vector>

#include "mwms/communicator.h"
#include "mwms/strategy.h"

namespace mwms::strategy {

/// Tensors of at least this many bytes are all-reduced alone, in place (Note [solo tensors]).
inline constexpr std::size_t kSoloBytes = std::size_t{256} << 10;

/// True when tensor b starts where tensor a ends (a flat gradient buffer).
bool adjacent_tensors(const TensorRef& a, const TensorRef& b) noexcept;

/// One bucket: tensors [first, last) of the list, `bytes` in all.
struct BucketSpan {
  std::size_t first = 0;
  std::size_t last = 0;
  std::size_t bytes = 0;
};

/// Cuts `tensors` into runs that share one dtype and fit in bytes_per_pack (a tensor larger than
/// a pack forms a run of its own). A tensor of at least solo_bytes is not copied into a pack with
/// others (Note [solo tensors]): it ends the run before it and forms its own, unless it lies
/// right after the run's last tensor in memory (then no copy is needed). Pure; never throws
/// except std::bad_alloc.
std::vector<BucketSpan> plan_buckets(const std::vector<TensorRef>& tensors,
                                     std::size_t bytes_per_pack, std::size_t solo_bytes);

/// Calls fn(first, last, bytes) for each bucket of plan_buckets, in list order. Throws what fn
/// throws (and std::bad_alloc).
template <typename Fn>
void for_each_bucket(const std::vector<TensorRef>& tensors, std::size_t bytes_per_pack,
                     std::size_t solo_bytes, Fn fn) {
  for (const BucketSpan& b : plan_buckets(tensors, bytes_per_pack, solo_bytes)) {
    fn(b.first, b.last, b.bytes);
  }
}

/// The solo_bytes argument of plan_buckets for these options: kSoloBytes, or no limit (SIZE_MAX)
/// with compression, where every float32 tensor is converted anyway (Note [solo tensors]).
std::size_t solo_bytes(const CommunicationOptions& options) noexcept;

/// The 16-bit type float32 gradients travel as (Note [compression]); `dtype` itself when they
/// are sent as they are (no compression, or a tensor of another dtype).
DataType wire_type(Compression c, DataType dtype) noexcept;

/// Copies tensors [first, last) of `t` back to back into `dst` (room for the sum of their counts
/// in `wire` elements), converted from float32 to `wire` when that differs from their dtype.
/// Never throws.
void pack_tensors(const std::vector<TensorRef>& t, std::size_t first, std::size_t last,
                  DataType wire, char* dst);
/// The inverse of pack_tensors: copies `src` back into tensors [first, last), converting from
/// `wire` to float32 where it differs from their dtype. Never throws.
void unpack_tensors(const std::vector<TensorRef>& t, std::size_t first, std::size_t last,
                    DataType wire, const char* src);

/// True when tensors [first, last) lie back to back in memory (a flat gradient buffer): such a
/// bucket is reduced in place, without a pack.
bool contiguous_tensors(const std::vector<TensorRef>& t, std::size_t first,
                        std::size_t last) noexcept;

/// The cross-worker half of all_reduce_gradients (and of a K > 1 replica all-reduce): all-reduces
/// `gradients` with `op` bucket by bucket (plan_buckets with options.bytes_per_pack, unset: 0, and
/// solo_bytes(options)), in place where the bucket is contiguous and uncompressed, else through
/// `pack` (grown to at least options.bytes_per_pack when too small). Blocking, collective across
/// workers; throws as Communicator::all_reduce.
void bucketed_all_reduce(Communicator& comm, const CommunicationOptions& options,
                         std::vector<char>& pack, const std::vector<TensorRef>& gradients,
                         ReduceOp op);

}  // namespace mwms::strategy
