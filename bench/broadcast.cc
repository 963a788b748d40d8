// broadcast_perf: the broadcast descriptor for the shared bench driver (bench/common).
// In place: one buffer of count = bytes / element size elements on every rank, sent from rank
// --root (default 0). busbw = algbw: every rank but the root must receive the whole buffer, and a
// pipelined ring moves each byte over each link once, as in nccl-tests (bench/README.md).
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

double busbw_factor(int /*world_size*/) { return 1.0; }

// The root holds 1..7; every other rank starts from -1..-7, so a rank the broadcast did not reach
// fails the check. Small integers: exact in every dtype.
double root_value(std::size_t i) { return static_cast<double>(i % 7 + 1); }

double input_value(std::size_t i, const CallShape& s) {
  return s.rank == s.root ? root_value(i) : -root_value(i);
}

double expected_value(std::size_t i, const CallShape& /*s*/) { return root_value(i); }

std::pair<std::size_t, std::size_t> checked_range(const CallShape& s) { return {0, s.count}; }

// Broadcasting a constant buffer leaves it unchanged: any value is a fixed point.
double timing_value(ReduceOp /*op*/) { return 0.0; }

void run(Communicator& comm, void* buffer, const CallShape& s, DataType dtype) {
  comm.broadcast(buffer, s.count, dtype, s.root);
}

void run_mpi(void* buffer, const CallShape& s, DataType dtype) {
  mpi::broadcast(buffer, s.count, dtype, s.root);
}

}  // namespace

const CollectiveDescriptor kBroadcast = {
    /*name=*/"broadcast",
    /*count_for_bytes=*/count_for_bytes,
    /*buffer_count=*/buffer_count,
    /*busbw_factor=*/busbw_factor,
    /*input_value=*/input_value,
    /*expected_value=*/expected_value,
    /*checked_range=*/checked_range,
    /*timing_value=*/timing_value,
    /*run=*/run,
    /*run_mpi=*/run_mpi,
    /*uses_op=*/false,
    /*uses_root=*/true,
    /*gloo_all_reduce=*/false,
    /*device=*/DeviceCollective::kBroadcast,
};

}  // namespace mwms::bench

int main(int argc, char** argv) {
  return mwms::bench::run_bench(argc, argv, mwms::bench::kBroadcast);
}
