// Input initialisation and exact result checks (nccl-tests `verifiable/` idea). Inputs are small
// integers chosen per op so that every partial result is exactly representable in every dtype,
// float16 and bfloat16 included; the check is then an equality test, never a tolerance.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/collective.h"
#include "mwms/types.h"

namespace mwms::bench {

/// Element `i` of a `dtype` buffer, widened to double (float16/bfloat16 decoded exactly).
double load_element(const void* buffer, std::size_t i, DataType dtype);
/// Stores `value` (rounded to nearest even for the narrow float types) as element `i`.
void store_element(void* buffer, std::size_t i, DataType dtype, double value);

/// Writes `collective.input_value(i, shape)` into every element of the buffer (buffer_count).
void fill_input(const CollectiveDescriptor& collective, void* buffer, const CallShape& shape,
                DataType dtype);
/// Writes `value` into each of `count` elements.
void fill_constant(void* buffer, std::size_t count, DataType dtype, double value);

/// Number of elements in `collective.checked_range(shape)` that differ from
/// `collective.expected_value(i, shape)`.
std::int64_t count_wrong(const CollectiveDescriptor& collective, const void* buffer,
                         const CallShape& shape, DataType dtype);

/// `a op b` in double: the local reference for one reduction step (kMean accumulates as kSum).
double reduce_reference(double a, double b, ReduceOp op);

/// The input of the reducing collectives (all-reduce, reduce-scatter): element `i` (an index into
/// the whole buffer) of rank `rank`, small integers whose reduction is exact in every dtype.
double reduction_input(std::size_t i, int rank, int world_size, ReduceOp op);
/// reduction_input(i, r, ...) reduced over every rank r with `op` (kMean divided by world_size).
double reduction_expected(std::size_t i, int world_size, ReduceOp op);

/// IEEE binary16 / bfloat16 <-> float, round to nearest even. The bench keeps its own copies so it
/// depends only on the public API (and does not check the library against itself).
float half_to_float(std::uint16_t h);
std::uint16_t float_to_half(float f);
float bfloat16_to_float(std::uint16_t b);
std::uint16_t float_to_bfloat16(float f);

}  // namespace mwms::bench
