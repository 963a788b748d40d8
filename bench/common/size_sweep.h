// The sweep over message sizes that both drivers run (the host path in driver.cc, the device path
// in device_sweep.cc): which sizes get a row, the table rows and footer rank 0 prints, the JSON it
// writes and the exit status. How one row is measured stays with each driver.
#pragma once

#include <cstddef>
#include <functional>

#include "common/collective.h"
#include "common/options.h"
#include "common/output.h"

namespace mwms::bench {

/// Sweeps `options.min_bytes` to `options.max_bytes` in steps of `options.step_factor`
/// (next_size()), calling `measure(count)` once per distinct per-rank count
/// (`collective.count_for_bytes` of the size: sizes below one element map to the same count and
/// get one row). Every rank calls it with the same arguments but `leader`; `measure` may be
/// collective (every rank calls it for the same counts in the same order). The leader (rank 0)
/// prints each row as it comes, then the footer, and writes the JSON to `options.json_path` when
/// set, with `run_info()` (called on the leader only, after the last row).
/// When `measure` throws, the leader first writes the JSON (when set) with the rows measured so
/// far and a failure record of that size and the error (Note [partial json] in size_sweep.cc;
/// a write error then goes to stderr), and the exception propagates: no footer is printed.
/// Returns the exit status: 1 when any row has wrong elements, else 0.
/// Blocking as `measure` is; @throws whatever `measure` throws, and write_json()'s BackendError.
int sweep_sizes(const CollectiveDescriptor& collective, const BenchOptions& options,
                int world_size, bool leader,
                const std::function<ResultRow(std::size_t count)>& measure,
                const std::function<RunInfo()>& run_info);

/// The start of a row of the sweep for a buffer of `elements` elements (the in-place buffer, as
/// nccl-tests print it): count, bytes, type and redop ("none" for collectives without an op) set
/// from `collective` and `options`; times, bandwidths and the wrong count left to the driver.
ResultRow start_row(const CollectiveDescriptor& collective, const BenchOptions& options,
                    std::size_t elements);

}  // namespace mwms::bench
