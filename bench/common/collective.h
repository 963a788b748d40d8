// The per-collective descriptor (nccl-tests' `testColl` idea as a C++ struct): everything the shared
// driver needs to know about one collective. A new *_perf tool is a descriptor plus a main() that
// hands it to run_bench(); the driver owns the CLI, timing, statistics, checks and output.
//
// Every collective runs IN PLACE on one buffer (nccl-tests' in-place mode). For all-reduce and
// broadcast the buffer holds `count` elements; for all-gather and reduce-scatter it holds
// world_size * count, rank r's own block being elements [r*count, (r+1)*count).
#pragma once

#include <cstddef>
#include <utility>

#include "mwms/mwms.h"

namespace mwms::bench {

/// What a descriptor's callbacks know about one call; the same on every rank except `rank`.
struct CallShape {
  std::size_t count;  ///< elements per rank as passed to the collective (count, send/recv_count)
  int rank;
  int world_size;
  ReduceOp op;
  int root;  ///< broadcast's root (--root); 0 for the others
};

/// Which DeviceCommunicator (and raw NCCL) collective a tool times under --backend nccl; the
/// device driver (device_bench.cc) runs it in place with the same buffer layout as `run`.
enum class DeviceCollective { kAllReduce, kReduceScatter, kAllGather, kBroadcast };

struct CollectiveDescriptor {
  /// Name in the banner and in the JSON "collective" key, e.g. "all_reduce".
  const char* name;

  /// Per-rank count for a row of `bytes` bytes, where `bytes` is the size nccl-tests prints: the
  /// whole buffer (for all-gather the gathered output, for reduce-scatter the full input).
  std::size_t (*count_for_bytes)(std::size_t bytes, std::size_t elem_bytes, int world_size);

  /// Elements in the in-place buffer for a per-rank `count` (count, or world_size * count). The
  /// table's size and count columns describe this buffer, as nccl-tests' do.
  std::size_t (*buffer_count)(std::size_t count, int world_size);

  /// busbw = algbw * busbw_factor(world_size): the share of the message a rank must move over its
  /// slowest link for the best algorithm, so that busbw is comparable to the link bandwidth.
  double (*busbw_factor)(int world_size);

  /// Value of buffer element `i` on rank `shape.rank` before the checked call. Must be chosen so
  /// that the result is exactly representable in every dtype (small integers): the check is exact.
  double (*input_value)(std::size_t i, const CallShape& shape);

  /// Value buffer element `i` must hold on rank `shape.rank` after the collective.
  double (*expected_value)(std::size_t i, const CallShape& shape);

  /// The elements [first, second) that hold a defined result on rank `shape.rank` and are checked.
  std::pair<std::size_t, std::size_t> (*checked_range)(const CallShape& shape);

  /// Value every buffer element holds during the timed iterations. Those run in place on the
  /// previous iteration's result, so the value must be a fixed point of the collective (0 for sum,
  /// 1 for prod): results then never overflow into inf/NaN, whose arithmetic can be slower.
  double (*timing_value)(ReduceOp op);

  /// Runs the collective once, in place, on the buffer described above.
  void (*run)(Communicator& comm, void* buffer, const CallShape& shape, DataType dtype);

  /// Runs the MPI equivalent once, in place (for --compare mpi); nullptr when there is none.
  void (*run_mpi)(void* buffer, const CallShape& shape, DataType dtype);

  /// False for collectives without a reduction: the redop column shows "none" and -o is refused.
  bool uses_op;
  /// True for rooted collectives (broadcast): the tool takes -r/--root.
  bool uses_root;
  /// True where --compare gloo times Gloo's all-reduce algorithms (all_reduce only).
  bool gloo_all_reduce;
  /// The collective under --backend nccl (device buffers, DeviceCommunicator and raw NCCL).
  DeviceCollective device;
};

/// Helpers for collectives whose buffer is world_size blocks of `count` elements (all-gather,
/// reduce-scatter): the printed size is the whole buffer, as in nccl-tests, and a rank moves
/// (n-1)/n of it.
std::size_t blocked_count_for_bytes(std::size_t bytes, std::size_t elem_bytes, int world_size);
std::size_t blocked_buffer_count(std::size_t count, int world_size);
double blocked_busbw_factor(int world_size);

/// The shared driver: parses argv, bootstraps, sweeps sizes, prints the table (rank 0) and returns
/// the process exit status (non-zero on wrong results or errors).
int run_bench(int argc, char** argv, const CollectiveDescriptor& collective);

}  // namespace mwms::bench
