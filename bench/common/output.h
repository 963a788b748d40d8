// What the bench prints: the nccl-tests table for people (header lines start with '#', one row
// per size, a footer with the out-of-bounds count and the average bus bandwidth) and a JSON array
// for machines. Only rank 0 calls these.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

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
};

/// ours busbw / mpi busbw (0 when MPI's is 0).
double ratio(const ResultRow& row);

/// The column header lines ("#  size  count ..." and the units line).
void print_table_header(std::ostream& out, bool with_mpi);
/// One row in the header's column layout.
void print_table_row(std::ostream& out, const ResultRow& row);
/// "# Out of bounds values : N OK|FAILED" and "# Avg bus bandwidth : X" (plus the MPI averages).
void print_table_footer(std::ostream& out, const std::vector<ResultRow>& rows);

/// Writes `rows` as a JSON array to `path`, one object per row with the keys collective, size,
/// count, type, redop, ranks, backend, time_us, algbw, busbw, wrong (null when not checked) and,
/// for --compare mpi, mpi_time_us, mpi_busbw, ratio. @throws mwms::BackendError if unwritable.
void write_json(const std::string& path, const std::vector<ResultRow>& rows,
                const std::string& collective, int ranks, const std::string& backend);

}  // namespace mwms::bench
