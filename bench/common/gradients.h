// The gradient tensors bucket_perf all-reduces: shaped like a CNN's (a weight and a bias per
// layer, the layers widening with depth), so that the sizes vary over three orders of magnitude
// as a real model's do, and the strategy's bucket plan (MultiWorkerMirroredStrategy's greedy
// packing into bytes_per_pack) computed the same way the strategy computes it.
#pragma once

#include <cstddef>
#include <vector>

namespace mwms::bench {

/// Element counts of `tensors` gradient tensors that hold exactly total_bytes / elem_bytes
/// elements together (total_bytes rounded down to whole elements). Tensor 2j is layer j's weight,
/// 2j+1 its bias; with an odd count the last tensor is a final weight. Layer j has
/// 64 << (4j / layers) channels (64 to 1024), a bias of that many elements (scaled down when the
/// biases would take more than a quarter of the budget) and a weight proportional to
/// channels(j) * channels(j-1) * k*k with k = 3, or k = 1 for every fourth layer (1x1
/// convolutions); the weights share what the biases leave, every tensor at least one element.
/// Deterministic. @throws mwms::InvalidArgument (tensors 0, elem_bytes 0, or fewer elements than
/// tensors), naming the values.
std::vector<std::size_t> model_like_counts(std::size_t tensors, std::size_t total_bytes,
                                           std::size_t elem_bytes);

/// How many all-reduces MultiWorkerMirroredStrategy::all_reduce_gradients makes for tensors of
/// these sizes in bytes (one dtype): consecutive tensors are packed while they fit in
/// bytes_per_pack, and a tensor larger than a pack is reduced on its own (the strategy's rule,
/// options.h). 0 for no tensors.
std::size_t count_buckets(const std::vector<std::size_t>& tensor_bytes, std::size_t bytes_per_pack);

}  // namespace mwms::bench
