// What the bench prints: the nccl-tests table for people (header lines start with '#', one row
// per size, a footer with the out-of-bounds count and the average bus bandwidth) and a JSON array
// for machines (the rows, then a summary record). Only rank 0 calls these.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "common/run_environment.h"

namespace mwms::bench {

/// One size of the sweep, already reduced across ranks.
struct ResultRow {
  std::size_t bytes = 0;
  std::size_t count = 0;
  std::string type;
  std::string redop;
  double time_us = 0;      ///< max over ranks of each rank's median iteration time
  double algbw = 0;        ///< GB/s: bytes / time
  double busbw = 0;        ///< GB/s: algbw * the collective's bus factor
  std::int64_t wrong = -1; ///< elements that failed the check, summed over ranks; -1: not checked
  bool has_mpi = false;    ///< the --compare mpi columns below are set
  double mpi_time_us = 0;
  double mpi_busbw = 0;
  bool has_gloo = false;   ///< the --compare gloo columns below are set
  double gloo_ring_time_us = 0;  ///< Gloo's AllreduceRingChunked, same buffer, same run
  double gloo_ring_busbw = 0;
  double gloo_hd_time_us = 0;    ///< Gloo's AllreduceHalvingDoubling
  double gloo_hd_busbw = 0;
  bool has_nccl = false;    ///< the --compare nccl columns below are set (--backend nccl)
  double nccl_time_us = 0;  ///< raw NCCL on the same device buffers, same run, same timing
  double nccl_busbw = 0;
};

/// ours busbw / mpi busbw (0 when MPI's is 0).
double ratio(const ResultRow& row);
/// ours busbw / the better of Gloo's two busbw (0 when both are 0).
double gloo_ratio(const ResultRow& row);
/// ours busbw / raw NCCL's busbw, computed as nccl time / ours time (the same thing, and defined on
/// one rank where both busbw are 0); 0 when ours time is 0.
double nccl_ratio(const ResultRow& row);

/// The size from which the NCCL backend must reach 97 % of raw NCCL's busbw (issue 6's target):
/// 16 MiB.
constexpr std::size_t kNcclTargetBytes = std::size_t{16} << 20;

/// The footer's numbers, computed once for the table and the JSON summary record.
struct Summary {
  std::int64_t out_of_bounds = 0;  ///< wrong elements over all checked rows
  double avg_busbw = 0;            ///< mean busbw over the rows (nccl-tests' "Avg bus bandwidth")
  bool has_mpi = false;            ///< --compare mpi: the two values below are set
  double avg_mpi_busbw = 0;
  double median_ratio = 0;         ///< median over rows of busbw / mpi busbw
  bool has_gloo = false;           ///< --compare gloo: the values below are set
  double avg_gloo_ring_busbw = 0;
  double avg_gloo_hd_busbw = 0;
  double median_gloo_ratio = 0;    ///< median over rows of busbw / Gloo's best busbw
  bool has_nccl = false;           ///< --compare nccl: the values below are set
  double avg_nccl_busbw = 0;
  double median_nccl_ratio = 0;  ///< median over rows of busbw / raw NCCL busbw
  /// Median of busbw / raw NCCL busbw over the rows of at least kNcclTargetBytes; -1 when the
  /// sweep has none.
  double median_nccl_ratio_large = -1;
};

/// Summarises the rows of one sweep.
Summary summarize(const std::vector<ResultRow>& rows);

/// What the JSON summary record says about the run besides the Summary.
struct RunInfo {
  std::string collective;  ///< "all_reduce", ...
  int ranks = 0;
  std::string backend;     ///< requested: auto, tcp, shm, mpi (the flag or MWMS_TRANSPORT)
  std::string describe;    ///< Communicator::describe(): the links actually used
  int iters = 0;
  int warmup_iters = 0;
  std::string mpi_library;  ///< --compare mpi: MPI_Get_library_version's first line, else empty
  /// MALLOC_MMAP_MAX_=0 and MALLOC_TRIM_THRESHOLD_=-1 were set (Open MPI at its best)
  bool malloc_keeps_freed = false;
  std::string gloo_library;  ///< --compare gloo: "gloo 0.5.0 (tcp transport)", else empty
  std::string nccl_library;  ///< --backend nccl: "NCCL 2.28.9", else empty
  /// The variables that forced or tuned what was measured (measured_environment()), rank 0's.
  std::vector<EnvSetting> environment;
};

/// A size of the sweep that failed (its collective threw): what the JSON records after the rows
/// measured before it.
struct SweepFailure {
  std::size_t bytes = 0;  ///< the whole in-place buffer, as a row's size
  std::size_t count = 0;  ///< its elements, as a row's count
  std::string type;
  std::string redop;
  std::string error;  ///< the exception's what()
};

/// The column header lines ("#  size  count ..." and the units line); the MPI columns, then the
/// Gloo columns (ring time and busbw, hd time and busbw, ratio to the better), then the NCCL
/// columns (nccl time, nccl busbw, ratio) when asked.
void print_table_header(std::ostream& out, bool with_mpi, bool with_gloo = false,
                        bool with_nccl = false);
/// One row in the header's column layout.
void print_table_row(std::ostream& out, const ResultRow& row);
/// nccl-tests' footer, formatted as they do ("# %-20s : %d %s", "# %-20s : %g"):
/// "# Out of bounds values : N OK|FAILED" and "# Avg bus bandwidth    : X", then with MPI its
/// average and the median ratio, with Gloo its two averages and the median ratio, with NCCL its
/// average, the median ratio and the median ratio from 16 MiB (issue 6's target, >= 0.97), then
/// "#".
void print_table_footer(std::ostream& out, const Summary& summary);

/// Writes `rows` as a JSON array to `path`: one object per row ("record": "row", then the keys
/// collective, size, count, type, redop, ranks, backend, time_us, algbw, busbw, wrong (null when
/// not checked) and, for --compare mpi, mpi_time_us, mpi_busbw, ratio, for --compare gloo,
/// gloo_ring_time_us, gloo_ring_busbw, gloo_hd_time_us, gloo_hd_busbw, gloo_ratio, for --compare
/// nccl, nccl_time_us, nccl_busbw, nccl_ratio), then, when `failure` is given, one object
/// ("record": "failure": collective, size, count, type, redop, ranks, backend, error), then one
/// summary object ("record": "summary": the RunInfo, with "environment" an object of its
/// settings, and the Summary; "complete" false and "ok" false after a failure).
/// @throws mwms::BackendError if unwritable.
void write_json(const std::string& path, const std::vector<ResultRow>& rows, const RunInfo& info,
                const Summary& summary, const SweepFailure* failure = nullptr);

/// One configuration of bucket_perf: `tensors` gradient tensors of `bytes` in all, all-reduced
/// once through the strategy's buckets (CPU: MultiWorkerMirroredStrategy::all_reduce_gradients;
/// device: DeviceCommunicator::all_reduce_bucket) and once as one all-reduce per tensor, on the
/// same buffers in the same run; already reduced across ranks.
struct BucketRow {
  std::size_t tensors = 0;
  std::size_t bytes = 0;           ///< all tensors together
  std::size_t smallest_bytes = 0;  ///< the smallest tensor
  std::size_t largest_bytes = 0;   ///< the largest tensor
  std::string type;
  std::string redop;
  std::size_t buckets = 0;      ///< all-reduces the bucketed path makes (1: one NCCL group)
  double bucketed_time_us = 0;  ///< max over ranks of each rank's median
  double bucketed_busbw = 0;    ///< GB/s, all-reduce factor 2(n-1)/n
  double separate_time_us = 0;  ///< one all-reduce per tensor; max over ranks of medians
  double separate_busbw = 0;
  std::int64_t wrong = -1;  ///< wrong elements of both paths, summed over ranks; -1 unchecked
};

/// separate time / bucketed time (0 when the bucketed time is 0): issue 6's target is >= 5 for
/// 200 tensors of 25 MiB in all.
double bucket_speedup(const BucketRow& row);

/// bucket_perf's table: the two header lines, the row, then "# Out of bounds values : N OK|FAILED"
/// and "# Bucket speedup : X (separate / bucketed)", then "#".
void print_bucket_table(std::ostream& out, const BucketRow& row);

/// What bucket_perf's JSON says about the run besides the row.
struct BucketRunInfo {
  std::string buffers;  ///< "host" (the strategy over the engine) or "device" (NCCL)
  int ranks = 0;
  std::string backend;             ///< asked for: auto, tcp, shm, mpi, nccl
  std::string describe;            ///< what the communicator says it used
  std::size_t bytes_per_pack = 0;  ///< the strategy's effective bucket size (0 on the device)
  int iters = 0;
  int warmup_iters = 0;
  /// The variables that forced or tuned what was measured (measured_environment()), rank 0's,
  /// read before --backend is handed to the strategy as MWMS_TRANSPORT.
  std::vector<EnvSetting> environment;
};
/// Writes bucket_perf's JSON array to `path`: one object ("record": "row", "tool": "bucket_perf",
/// buffers, ranks, backend, describe, tensors, size, smallest, largest, type, redop,
/// bytes_per_pack, buckets, bucketed_time_us, bucketed_busbw, separate_time_us, separate_busbw,
/// speedup, wrong (null when unchecked), iters, warmup_iters, environment (an object)). @throws mwms::BackendError if
/// unwritable.
void write_bucket_json(const std::string& path, const BucketRow& row, const BucketRunInfo& info);

}  // namespace mwms::bench
