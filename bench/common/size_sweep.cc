// The size sweep shared by the host and device drivers (size_sweep.h).
#include "common/size_sweep.h"

#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "mwms/mwms.h"

namespace mwms::bench {
namespace {

// Note [partial json]: a sweep to 1 GiB can run for many minutes and fail at its last size (a
// peer killed, a timeout, memory). The rows measured until then are good measurements, so the
// JSON is written with them, then a "failure" record naming the size and the error, and a
// summary saying the sweep is not complete; the caller still gets the exception (exit status 2).
// A failure to write that file must not hide the collective's error, which is what the user
// needs: it is reported on stderr and the original exception goes on.
void write_partial_json(const CollectiveDescriptor& collective, const BenchOptions& options,
                        int world_size, std::size_t count, const std::string& error,
                        const std::vector<ResultRow>& rows,
                        const std::function<RunInfo()>& run_info) {
  try {
    const ResultRow start = start_row(
        collective, options,
        collective.buffer_count != nullptr ? collective.buffer_count(count, world_size) : count);
    SweepFailure failure{start.bytes, start.count, start.type, start.redop, error};
    write_json(options.json_path, rows, run_info(), summarize(rows), &failure);
  } catch (const std::exception& e) {
    std::cerr << collective.name << "_perf: --json " << options.json_path
              << ": the rows before the failed size were not written: " << e.what() << "\n"
              << std::flush;
  }
}

}  // namespace

int sweep_sizes(const CollectiveDescriptor& collective, const BenchOptions& options,
                int world_size, bool leader,
                const std::function<ResultRow(std::size_t count)>& measure,
                const std::function<RunInfo()>& run_info) {
  const std::size_t elem_bytes = dtype_size(options.dtype);
  std::vector<ResultRow> rows;
  std::size_t previous_count = static_cast<std::size_t>(-1);
  for (std::size_t bytes = options.min_bytes; bytes <= options.max_bytes;) {
    const std::size_t count = collective.count_for_bytes(bytes, elem_bytes, world_size);
    if (count != previous_count) {  // sizes below one element map to the same count
      try {
        rows.push_back(measure(count));
      } catch (const std::exception& e) {
        if (leader && !options.json_path.empty()) {
          write_partial_json(collective, options, world_size, count, e.what(), rows, run_info);
        }
        throw;
      }
      if (leader) print_table_row(std::cout, rows.back());
      previous_count = count;
    }
    const std::size_t next = next_size(bytes, options.step_factor);
    if (next == bytes) break;
    bytes = next;
  }
  if (leader) {
    const Summary summary = summarize(rows);
    print_table_footer(std::cout, summary);
    if (!options.json_path.empty()) write_json(options.json_path, rows, run_info(), summary);
  }
  for (const auto& row : rows) {
    if (row.wrong > 0) return 1;
  }
  return 0;
}

ResultRow start_row(const CollectiveDescriptor& collective, const BenchOptions& options,
                    std::size_t elements) {
  ResultRow row;
  row.count = elements;
  row.bytes = elements * dtype_size(options.dtype);
  row.type = std::string(to_string(options.dtype));
  row.redop = collective.uses_op ? std::string(to_string(options.op)) : "none";
  return row;
}

}  // namespace mwms::bench
