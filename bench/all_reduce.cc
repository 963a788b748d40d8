// all_reduce_perf: the all-reduce descriptor for the shared bench driver (bench/common).
// In place, count = bytes / element size on every rank; busbw factor 2(n-1)/n because a ring
// all-reduce sends and receives 2(n-1)/n of the buffer per rank (reduce-scatter + all-gather),
// which is also the lower bound for any algorithm (bench/README.md).
#include <cstddef>
#include <utility>

#include "common/collective.h"
#include "common/mpi_baseline.h"
#include "common/verification.h"
#include "mwms/mwms.h"

namespace mwms::bench {
namespace {

std::size_t count_for_bytes(std::size_t bytes, std::size_t elem_bytes, int /*world_size*/) {
  return bytes / elem_bytes;
}

std::size_t buffer_count(std::size_t count, int /*world_size*/) { return count; }

double busbw_factor(int world_size) { return 2.0 * (world_size - 1) / world_size; }

// The shared reduction pattern (verification.cc): small integers, exact in every dtype.
double input_value(std::size_t i, const CallShape& s) {
  return reduction_input(i, s.rank, s.world_size, s.op);
}

double expected_value(std::size_t i, const CallShape& s) {
  return reduction_expected(i, s.world_size, s.op);
}

std::pair<std::size_t, std::size_t> checked_range(const CallShape& s) { return {0, s.count}; }

double timing_value(ReduceOp op) { return op == ReduceOp::kProd ? 1.0 : 0.0; }

void run(Communicator& comm, void* buffer, const CallShape& s, DataType dtype) {
  comm.all_reduce(buffer, s.count, dtype, s.op);
}

void run_mpi(void* buffer, const CallShape& s, DataType dtype) {
  mpi::all_reduce(buffer, s.count, dtype, s.op);
}

}  // namespace

const CollectiveDescriptor kAllReduce = {
    /*name=*/"all_reduce",
    /*count_for_bytes=*/count_for_bytes,
    /*buffer_count=*/buffer_count,
    /*busbw_factor=*/busbw_factor,
    /*input_value=*/input_value,
    /*expected_value=*/expected_value,
    /*checked_range=*/checked_range,
    /*timing_value=*/timing_value,
    /*run=*/run,
    /*run_mpi=*/run_mpi,
    /*uses_op=*/true,
    /*uses_root=*/false,
    /*gloo_all_reduce=*/true,
    /*device=*/DeviceCollective::kAllReduce,
};

}  // namespace mwms::bench

int main(int argc, char** argv) {
  return mwms::bench::run_bench(argc, argv, mwms::bench::kAllReduce);
}
