#include "common/output.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <ostream>

#include "common/statistics.h"
#include "mwms/errors.h"

namespace mwms::bench {

double ratio(const ResultRow& row) { return row.mpi_busbw > 0 ? row.busbw / row.mpi_busbw : 0; }

namespace {

// One table column: header text, unit line text and width. Rows and headers share this list, so
// they cannot drift apart; two spaces separate columns even when a value overflows its width.
struct Column {
  const char* name;
  const char* unit;
  int width;
};
const Column kColumns[] = {{"size", "(B)", 12},      {"count", "(elements)", 12},
                           {"type", "", 8},          {"redop", "", 5},
                           {"time", "(us)", 9},      {"algbw", "(GB/s)", 7},
                           {"busbw", "(GB/s)", 7},   {"#wrong", "", 6}};
const Column kMpiColumns[] = {{"mpi time", "(us)", 9}, {"mpi busbw", "(GB/s)", 9},
                              {"ratio", "", 6}};

template <typename Pick>
void print_header_line(std::ostream& out, bool with_mpi, Pick pick) {
  out << "#";
  bool first = true;
  for (const Column& c : kColumns) {
    // The leading '#' takes the place of one separator character in the first column.
    out << (first ? " " : "  ") << std::setw(c.width) << pick(c);
    first = false;
  }
  if (with_mpi) {
    for (const Column& c : kMpiColumns) out << "  " << std::setw(c.width) << pick(c);
  }
  out << "\n";
}

}  // namespace

// Layout follows nccl-tests (right-aligned, '#' header lines) so that scripts written for its
// output keep working.
void print_table_header(std::ostream& out, bool with_mpi) {
  print_header_line(out, with_mpi, [](const Column& c) { return c.name; });
  print_header_line(out, with_mpi, [](const Column& c) { return c.unit; });
  out << std::flush;
}

void print_table_row(std::ostream& out, const ResultRow& row) {
  const Column* c = kColumns;
  out << "  " << std::setw(c[0].width) << row.bytes << "  " << std::setw(c[1].width) << row.count
      << "  " << std::setw(c[2].width) << row.type << "  " << std::setw(c[3].width) << row.redop
      << std::fixed << std::setprecision(2) << "  " << std::setw(c[4].width) << row.time_us << "  "
      << std::setw(c[5].width) << row.algbw << "  " << std::setw(c[6].width) << row.busbw << "  "
      << std::setw(c[7].width);
  if (row.wrong < 0) {
    out << "N/A";
  } else {
    out << row.wrong;
  }
  if (row.has_mpi) {
    const Column* m = kMpiColumns;
    out << "  " << std::setw(m[0].width) << row.mpi_time_us << "  " << std::setw(m[1].width)
        << row.mpi_busbw << "  " << std::setw(m[2].width) << ratio(row);
  }
  out << std::defaultfloat << "\n" << std::flush;
}

void print_table_footer(std::ostream& out, const std::vector<ResultRow>& rows) {
  std::int64_t wrong = 0;
  std::vector<double> busbw, mpi_busbw, ratios;
  for (const auto& row : rows) {
    if (row.wrong > 0) wrong += row.wrong;
    busbw.push_back(row.busbw);
    if (row.has_mpi) {
      mpi_busbw.push_back(row.mpi_busbw);
      ratios.push_back(ratio(row));
    }
  }
  out << "# Out of bounds values : " << wrong << (wrong == 0 ? " OK" : " FAILED") << "\n";
  out << std::fixed << std::setprecision(3);
  out << "# Avg bus bandwidth    : " << mean(busbw) << "\n";
  if (!mpi_busbw.empty()) {
    out << "# Avg MPI bus bandwidth: " << mean(mpi_busbw) << "\n";
    out << "# Median busbw ratio   : " << median(ratios) << " (libmwms / MPI)\n";
  }
  out << "#\n" << std::defaultfloat << std::flush;
}

void write_json(const std::string& path, const std::vector<ResultRow>& rows,
                const std::string& collective, int ranks, const std::string& backend) {
  nlohmann::ordered_json array = nlohmann::ordered_json::array();
  for (const auto& row : rows) {
    nlohmann::ordered_json o;
    o["collective"] = collective;
    o["size"] = row.bytes;
    o["count"] = row.count;
    o["type"] = row.type;
    o["redop"] = row.redop;
    o["ranks"] = ranks;
    o["backend"] = backend;
    o["time_us"] = row.time_us;
    o["algbw"] = row.algbw;
    o["busbw"] = row.busbw;
    o["wrong"] = row.wrong < 0 ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(row.wrong);
    if (row.has_mpi) {
      o["mpi_time_us"] = row.mpi_time_us;
      o["mpi_busbw"] = row.mpi_busbw;
      o["ratio"] = ratio(row);
    }
    array.push_back(std::move(o));
  }
  std::ofstream file(path);
  if (file) file << array.dump(2) << "\n";
  if (!file) {
    const int err = errno;
    throw BackendError("cannot write --json file " + path + ": " + std::strerror(err), err);
  }
}

}  // namespace mwms::bench
