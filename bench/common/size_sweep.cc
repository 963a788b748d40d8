// The size sweep shared by the host and device drivers (size_sweep.h).
#include "common/size_sweep.h"

#include <iostream>
#include <string>
#include <vector>

#include "mwms/mwms.h"

namespace mwms::bench {

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
      rows.push_back(measure(count));
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
