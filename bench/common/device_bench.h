// --backend nccl: the bench on device buffers through DeviceCommunicator (one GPU per rank), and,
// with --compare nccl, raw NCCL on the same buffers in the same run: its own NCCL communicator,
// whose unique id rank 0 broadcasts through the DeviceCommunicator (so any launcher works:
// mpirun, TF_CONFIG, a single process). Two implementations of this header exist and CMake
// compiles exactly one: device_bench.cc (a build with NCCL: CUDA runtime and NCCL) and
// device_bench_none.cc (without), so no #if is needed anywhere in the bench. The sweep itself is
// device_sweep.cc, over a table of device calls that device_bench.cc fills.
//
// Note [device timing]: a row's time on the device is nccl-tests' own measure: after a barrier,
// the n timed calls are enqueued back to back on one stream and the clock stops when the last
// one has completed; time = elapsed / n, on each rank, then the maximum over ranks. Ours and raw
// NCCL are timed the same way, one after the other, so `vs nccl` is ours busbw / raw NCCL busbw
// from one run (issue 6's target: >= 0.97 from 16 MiB). A per-call wait would time the host's
// polling cadence instead of the collective. bucket_perf's device path times each whole
// iteration (a bucket, or 200 enqueued all-reduces, until complete) and takes the median.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "common/collective.h"
#include "common/options.h"
#include "common/output.h"

namespace mwms::bench::device {

/// True when the bench was built with NCCL (libmwms's MWMS_HAVE_NCCL).
bool built_with_nccl();

/// Empty when this process sees a usable CUDA device; otherwise why not: the CUDA call, the error
/// name and text ("cudaGetDeviceCount: cudaErrorInsufficientDriver: ...", or no device). Never
/// throws. Without NCCL: "this build has no NCCL".
std::string no_device_reason();

/// "NCCL 2.28.9" (ncclGetVersion: the library loaded at run time); empty without NCCL.
std::string nccl_version();

/// The --backend nccl sweep of `collective` (rank 0 prints the table, footer and JSON): device
/// buffers of the largest size, the checked first iteration copied back and verified as the host
/// path does, ours timed per Note [device timing], then raw NCCL under options.compare_nccl.
/// Returns the exit status (1 when any element was wrong). Blocking; every wait has a deadline
/// (MWMS_TIMEOUT_SECONDS for ours, kRawNcclTimeoutSeconds for raw NCCL).
/// @throws as DeviceCommunicator::create and its collectives; BackendError for a CUDA or raw
///   NCCL call (its code and text); TimeoutError when raw NCCL misses its deadline (its
///   communicator aborted); InvalidUsage in a build without NCCL.
int run_sweep(const CollectiveDescriptor& collective, const BenchOptions& options);

/// bucket_perf on device buffers: tensors of `counts` elements (separate allocations) all-reduced
/// as one DeviceCommunicator::all_reduce_bucket (one NCCL group) and as one all_reduce per tensor
/// (all enqueued, then waited for), each checked once and timed as the median of
/// options.iters iterations, max over ranks. `*leader` says whether this is rank 0 (the one that
/// prints). @throws as run_sweep().
BucketRow run_buckets(const std::vector<std::size_t>& counts, const BucketOptions& options,
                      BucketRunInfo* info, bool* leader);

/// Raw NCCL's deadline for its communicator's creation and for each timed batch, in seconds.
constexpr double kRawNcclTimeoutSeconds = 300;

}  // namespace mwms::bench::device
