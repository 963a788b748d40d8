// How the strategy cuts a gradient list into buckets (packs), shared by the blocking and the
// overlapped paths (multi_worker_mirrored_strategy.cc), so that every worker, given the same
// list, issues the same all-reduces.
#pragma once

#include <cstddef>
#include <vector>

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

}  // namespace mwms::strategy
