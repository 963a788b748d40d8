// all_gather_perf: the all-gather descriptor for the shared bench driver (bench/common).
// In place like nccl-tests' in-place mode: one buffer of n * count elements, rank r's input is
// block r (elements [r*count, (r+1)*count)) and the call gathers every block into the buffer.
// As in nccl-tests' all_gather, size and count are the whole gathered buffer (n * count elements)
// and busbw = algbw * (n-1)/n: each rank must receive the n-1 blocks it does not have, (n-1)/n of
// the size, whatever the algorithm (bench/README.md).
#include <cstddef>
#include <utility>

#include "common/collective.h"
#include "common/mpi_baseline.h"
#include "common/verification.h"
#include "mwms/mwms.h"

namespace mwms::bench {
namespace {

// Integers below 256 (exact even in bfloat16) that name the owning rank (r % 31 for up to 31
// ranks) and the position. Never negative, unlike kNotGathered.
double pattern(std::size_t i, int rank) {
  return static_cast<double>(i % 7) + 8.0 * static_cast<double>(rank % 31);
}

// What the blocks of other ranks hold before the gather: a block the gather did not deliver keeps
// it and fails the check, and so does a send from the wrong block.
constexpr double kNotGathered = -1.0;

double input_value(std::size_t i, const CallShape& s) {
  return i / s.count == static_cast<std::size_t>(s.rank) ? pattern(i, s.rank) : kNotGathered;
}

// Element i belongs to block i / count and must hold that rank's input at i.
double expected_value(std::size_t i, const CallShape& s) {
  return pattern(i, static_cast<int>(i / s.count));
}

std::pair<std::size_t, std::size_t> checked_range(const CallShape& s) {
  return {0, blocked_buffer_count(s.count, s.world_size)};
}

// Gathering a constant buffer leaves it unchanged: any value is a fixed point.
double timing_value(ReduceOp /*op*/) { return 0.0; }

void run(Communicator& comm, void* buffer, const CallShape& s, DataType dtype) {
  auto* bytes = static_cast<unsigned char*>(buffer);
  const std::size_t block = s.count * dtype_size(dtype);
  comm.all_gather(bytes + static_cast<std::size_t>(s.rank) * block, buffer, s.count, dtype);
}

void run_mpi(void* buffer, const CallShape& s, DataType dtype) {
  mpi::all_gather(buffer, s.count, dtype);
}

}  // namespace

const CollectiveDescriptor kAllGather = {
    /*name=*/"all_gather",
    /*count_for_bytes=*/blocked_count_for_bytes,
    /*buffer_count=*/blocked_buffer_count,
    /*busbw_factor=*/blocked_busbw_factor,
    /*input_value=*/input_value,
    /*expected_value=*/expected_value,
    /*checked_range=*/checked_range,
    /*timing_value=*/timing_value,
    /*run=*/run,
    /*run_mpi=*/run_mpi,
    /*uses_op=*/false,
    /*uses_root=*/false,
    /*gloo_all_reduce=*/false,
    /*device=*/DeviceCollective::kAllGather,
};

}  // namespace mwms::bench

int main(int argc, char** argv) {
  return mwms::bench::run_bench(argc, argv, mwms::bench::kAllGather);
}
