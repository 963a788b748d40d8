// all_reduce_perf: the all-reduce descriptor for the shared bench driver (bench/common).
// In place, count = bytes / element size on every rank; busbw factor 2(n-1)/n because a ring
// all-reduce sends and receives 2(n-1)/n of the buffer per rank (reduce-scatter + all-gather),
// which is also the lower bound for any algorithm (bench/README.md).
#include <cstddef>

#include "common/collective.h"
#include "common/mpi_baseline.h"
#include "common/verification.h"
#include "mwms/mwms.h"

namespace mwms::bench {
namespace {

std::size_t count_for_bytes(std::size_t bytes, std::size_t elem_bytes, int /*world_size*/) {
  return bytes / elem_bytes;
}

double busbw_factor(int world_size) { return 2.0 * (world_size - 1) / world_size; }

// Small integers, so every partial sum/product/min/max is exact in every dtype, even float16
// (integers up to 2048) and bfloat16 (up to 256) for the rank counts a bench runs with:
//   sum:  (r + i) % 7                       -> at most 6n
//   mean: n * ((r + i) % 7)                 -> the sum is a multiple of n, the mean exact
//   prod: 2 when (r + i) % 3 == 0, else 1   -> a power of two, at most 2^ceil(n/3)
//   min/max: (r + i) % 7 - 3                -> negative values too
double input_value(std::size_t i, int rank, int world_size, ReduceOp op) {
  const auto k = static_cast<double>((i + static_cast<std::size_t>(rank)) % 7);
  switch (op) {
    case ReduceOp::kSum: return k;
    case ReduceOp::kMean: return world_size * k;
    case ReduceOp::kProd: return (i + static_cast<std::size_t>(rank)) % 3 == 0 ? 2.0 : 1.0;
    case ReduceOp::kMin:
    case ReduceOp::kMax: return k - 3;
  }
  return 0;
}

double expected_value(std::size_t i, int world_size, ReduceOp op) {
  double result = input_value(i, 0, world_size, op);
  for (int r = 1; r < world_size; ++r) {
    result = reduce_reference(result, input_value(i, r, world_size, op), op);
  }
  // The mean's sum is a multiple of n by construction, so the division is exact for integer
  // dtypes (truncating) and float dtypes alike.
  return op == ReduceOp::kMean ? result / world_size : result;
}

double timing_value(ReduceOp op) { return op == ReduceOp::kProd ? 1.0 : 0.0; }

void run(Communicator& comm, void* buffer, std::size_t count, DataType dtype, ReduceOp op) {
  comm.all_reduce(buffer, count, dtype, op);
}

}  // namespace

const CollectiveDescriptor kAllReduce = {
    /*name=*/"all_reduce",
    /*count_for_bytes=*/count_for_bytes,
    /*busbw_factor=*/busbw_factor,
    /*input_value=*/input_value,
    /*expected_value=*/expected_value,
    /*timing_value=*/timing_value,
    /*run=*/run,
    /*run_mpi=*/mpi::all_reduce,
};

}  // namespace mwms::bench

int main(int argc, char** argv) {
  return mwms::bench::run_bench(argc, argv, mwms::bench::kAllReduce);
}
