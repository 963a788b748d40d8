// reduce_scatter_perf: the reduce-scatter descriptor for the shared bench driver (bench/common).
// In place like nccl-tests' in-place mode: one buffer of n * count elements of input on every
// rank; rank r's result (the reduction over ranks of block r) replaces block r of its buffer.
// As in nccl-tests' reduce_scatter, size and count are the whole input (n * count elements) and
// busbw = algbw * (n-1)/n: each rank must receive a contribution to its block from each of the
// n-1 others, (n-1)/n of the size, whatever the algorithm (bench/README.md).
#include <cstddef>
#include <utility>

#include "common/collective.h"
#include "common/mpi_baseline.h"
#include "common/verification.h"
#include "mwms/mwms.h"

namespace mwms::bench {
namespace {

// The all-reduce pattern over the whole input (verification.cc): block r's expected result is the
// all-reduce result at the same global indices, exact in every dtype.
double input_value(std::size_t i, const CallShape& s) {
  return reduction_input(i, s.rank, s.world_size, s.op);
}

double expected_value(std::size_t i, const CallShape& s) {
  return reduction_expected(i, s.world_size, s.op);
}

// Only this rank's block holds a result; the other blocks are left as they were.
std::pair<std::size_t, std::size_t> checked_range(const CallShape& s) {
  const std::size_t first = static_cast<std::size_t>(s.rank) * s.count;
  return {first, first + s.count};
}

// 0 (1 for prod) reduces to itself, and the blocks that are not written keep it: a fixed point.
double timing_value(ReduceOp op) { return op == ReduceOp::kProd ? 1.0 : 0.0; }

void run(Communicator& comm, void* buffer, const CallShape& s, DataType dtype) {
  auto* bytes = static_cast<unsigned char*>(buffer);
  const std::size_t block = s.count * dtype_size(dtype);
  comm.reduce_scatter(buffer, bytes + static_cast<std::size_t>(s.rank) * block, s.count, dtype,
                      s.op);
}

// MPI's in-place convention puts the result at the start of the buffer, not at block r; that
// differs in where one block lands, not in the traffic, and MPI's result is not checked.
void run_mpi(void* buffer, const CallShape& s, DataType dtype) {
  mpi::reduce_scatter(buffer, s.count, dtype, s.op);
}

}  // namespace

const CollectiveDescriptor kReduceScatter = {
    /*name=*/"reduce_scatter",
    /*count_for_bytes=*/blocked_count_for_bytes,
    /*buffer_count=*/blocked_buffer_count,
    /*busbw_factor=*/blocked_busbw_factor,
    /*input_value=*/input_value,
    /*expected_value=*/expected_value,
    /*checked_range=*/checked_range,
    /*timing_value=*/timing_value,
    /*run=*/run,
    /*run_mpi=*/run_mpi,
    /*uses_op=*/true,
    /*uses_root=*/false,
    /*gloo_all_reduce=*/false,
    /*device=*/DeviceCollective::kReduceScatter,
};

}  // namespace mwms::bench

int main(int argc, char** argv) {
  return mwms::bench::run_bench(argc, argv, mwms::bench::kReduceScatter);
}
