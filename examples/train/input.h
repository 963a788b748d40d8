/// @file input.h
/// Turning dataset rows into model input: the per-epoch global shuffle and the gather of one
/// worker's rows of a global batch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "idx_reader.h"

namespace mwms::train {

/// The order of the training set for `epoch`: a Fisher-Yates permutation of 0..n-1 from a
/// generator seeded with (seed, epoch) only, so every worker computes the same one without
/// talking to the others, and a resumed job sees the same order as an uninterrupted one.
void epoch_order(std::uint64_t seed, int epoch, std::size_t n, std::vector<std::uint32_t>& out);

/// Copies the images `indices[0..count)` of `data` to `x` (count * image_size floats, one image
/// after another), standardised with Fashion-MNIST's pixel mean and standard deviation, and their
/// labels to `labels`.
///
/// The dataset stays in bytes: the batch has to be gathered (rows are shuffled) anyway, and
/// converting during that copy costs nothing extra while the 47 MB of training bytes stay far
/// more cache-friendly than 188 MB of floats.
void gather_batch(const Dataset& data, const std::uint32_t* indices, std::size_t count, float* x,
                  std::uint8_t* labels);

/// Same for the consecutive rows [begin, begin + count) (evaluation in file order).
void gather_range(const Dataset& data, std::size_t begin, std::size_t count, float* x,
                  std::uint8_t* labels);

}  // namespace mwms::train
