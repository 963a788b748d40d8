// The per-collective descriptor (nccl-tests' `testColl` idea as a C++ struct): everything the shared
// driver needs to know about one collective. A new *_perf tool is a descriptor plus a main() that
// hands it to run_bench(); the driver owns the CLI, timing, statistics, checks and output.
#pragma once

#include <cstddef>

#include "mwms/mwms.h"

namespace mwms::bench {

struct CollectiveDescriptor {
  /// Name in the banner and in the JSON "collective" key, e.g. "all_reduce".
  const char* name;

  /// Elements per rank for a message of `bytes` bytes (nccl-tests reports size = count * elem).
  std::size_t (*count_for_bytes)(std::size_t bytes, std::size_t elem_bytes, int world_size);

  /// busbw = algbw * busbw_factor(world_size): the share of the message a rank must move over its
  /// slowest link for the best algorithm, so that busbw is comparable to the link bandwidth.
  double (*busbw_factor)(int world_size);

  /// Value of element `i` of rank `rank`'s input for check runs. Must be chosen so that the result
  /// is exactly representable in every dtype (small integers), which makes the check exact.
  double (*input_value)(std::size_t i, int rank, int world_size, ReduceOp op);

  /// Value element `i` must hold on every rank after the collective, computed locally.
  double (*expected_value)(std::size_t i, int world_size, ReduceOp op);

  /// Value every input element holds during the timed iterations. Those run in place on the
  /// previous iteration's result, so the value must be a fixed point of the collective (0 for sum,
  /// 1 for prod): results then never overflow into inf/NaN, whose arithmetic can be slower.
  double (*timing_value)(ReduceOp op);

  /// Runs the collective once, in place, on `count` elements at `buffer`.
  void (*run)(Communicator& comm, void* buffer, std::size_t count, DataType dtype, ReduceOp op);

  /// Runs the MPI equivalent once, in place (for --compare mpi); nullptr when there is none.
  void (*run_mpi)(void* buffer, std::size_t count, DataType dtype, ReduceOp op);
};

/// The shared driver: parses argv, bootstraps, sweeps sizes, prints the table (rank 0) and returns
/// the process exit status (non-zero on wrong results or errors).
int run_bench(int argc, char** argv, const CollectiveDescriptor& collective);

}  // namespace mwms::bench
