#include "common/output.h"

#include <algorithm>
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

double gloo_ratio(const ResultRow& row) {
  const double best = std::max(row.gloo_ring_busbw, row.gloo_hd_busbw);
  return best > 0 ? row.busbw / best : 0;
}

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
const Column kGlooColumns[] = {{"ring busbw", "(GB/s)", 10}, {"hd busbw", "(GB/s)", 9},
                               {"vs gloo", "", 7}};

template <typename Pick>
void print_header_line(std::ostream& out, bool with_mpi, bool with_gloo, Pick pick) {
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
  if (with_gloo) {
    for (const Column& c : kGlooColumns) out << "  " << std::setw(c.width) << pick(c);
  }
  out << "\n";
}

}  // namespace

// Layout follows nccl-tests (right-aligned, '#' header lines) so that scripts written for its
// output keep working.
void print_table_header(std::ostream& out, bool with_mpi, bool with_gloo) {
  print_header_line(out, with_mpi, with_gloo, [](const Column& c) { return c.name; });
  print_header_line(out, with_mpi, with_gloo, [](const Column& c) { return c.unit; });
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
  if (row.has_gloo) {
    const Column* g = kGlooColumns;
    out << "  " << std::setw(g[0].width) << row.gloo_ring_busbw << "  " << std::setw(g[1].width)
        << row.gloo_hd_busbw << "  " << std::setw(g[2].width) << gloo_ratio(row);
  }
  out << std::defaultfloat << "\n" << std::flush;
}

Summary summarize(const std::vector<ResultRow>& rows) {
  Summary s;
  std::vector<double> busbw, mpi_busbw, ratios, ring, hd, gloo_ratios;
  for (const auto& row : rows) {
    if (row.wrong > 0) s.out_of_bounds += row.wrong;
    busbw.push_back(row.busbw);
    if (row.has_mpi) {
      mpi_busbw.push_back(row.mpi_busbw);
      ratios.push_back(ratio(row));
    }
    if (row.has_gloo) {
      ring.push_back(row.gloo_ring_busbw);
      hd.push_back(row.gloo_hd_busbw);
      gloo_ratios.push_back(gloo_ratio(row));
    }
  }
  s.has_gloo = !ring.empty();
  s.avg_gloo_ring_busbw = mean(ring);
  s.avg_gloo_hd_busbw = mean(hd);
  s.median_gloo_ratio = median(gloo_ratios);
  s.avg_busbw = mean(busbw);
  s.has_mpi = !mpi_busbw.empty();
  s.avg_mpi_busbw = mean(mpi_busbw);
  s.median_ratio = median(ratios);
  return s;
}

namespace {

// nccl-tests' "# %-20s : " label.
std::ostream& label(std::ostream& out, const char* name) {
  return out << "# " << std::left << std::setw(20) << name << std::right << " : ";
}

}  // namespace

void print_table_footer(std::ostream& out, const Summary& s) {
  // nccl-tests' lines (their common.cu: "%d %s", then "%g " with its trailing space), so that
  // scripts that grep or awk their output read ours. defaultfloat with precision 6 is %g.
  out << std::defaultfloat << std::setprecision(6);
  label(out, "Out of bounds values") << s.out_of_bounds << (s.out_of_bounds == 0 ? " OK" : " FAILED")
                                     << "\n";
  label(out, "Avg bus bandwidth") << s.avg_busbw << " \n";
  if (s.has_mpi) {
    label(out, "Avg MPI bus bandwidth") << s.avg_mpi_busbw << " \n";
    label(out, "Median busbw ratio") << s.median_ratio << " (libmwms / MPI)\n";
  }
  if (s.has_gloo) {
    label(out, "Avg Gloo ring busbw") << s.avg_gloo_ring_busbw << " \n";
    label(out, "Avg Gloo hd busbw") << s.avg_gloo_hd_busbw << " \n";
    label(out, "Median vs Gloo best") << s.median_gloo_ratio << " (libmwms / max(ring, hd))\n";
  }
  out << "#\n" << std::flush;
}

void write_json(const std::string& path, const std::vector<ResultRow>& rows, const RunInfo& info,
                const Summary& summary) {
  nlohmann::ordered_json array = nlohmann::ordered_json::array();
  for (const auto& row : rows) {
    nlohmann::ordered_json o;
    o["record"] = "row";
    o["collective"] = info.collective;
    o["size"] = row.bytes;
    o["count"] = row.count;
    o["type"] = row.type;
    o["redop"] = row.redop;
    o["ranks"] = info.ranks;
    o["backend"] = info.backend;
    o["time_us"] = row.time_us;
    o["algbw"] = row.algbw;
    o["busbw"] = row.busbw;
    o["wrong"] = row.wrong < 0 ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(row.wrong);
    if (row.has_mpi) {
      o["mpi_time_us"] = row.mpi_time_us;
      o["mpi_busbw"] = row.mpi_busbw;
      o["ratio"] = ratio(row);
    }
    if (row.has_gloo) {
      o["gloo_ring_time_us"] = row.gloo_ring_time_us;
      o["gloo_ring_busbw"] = row.gloo_ring_busbw;
      o["gloo_hd_time_us"] = row.gloo_hd_time_us;
      o["gloo_hd_busbw"] = row.gloo_hd_busbw;
      o["gloo_ratio"] = gloo_ratio(row);
    }
    array.push_back(std::move(o));
  }
  nlohmann::ordered_json s;
  s["record"] = "summary";
  s["collective"] = info.collective;
  s["ranks"] = info.ranks;
  s["backend"] = info.backend;
  s["describe"] = info.describe;
  s["iters"] = info.iters;
  s["warmup_iters"] = info.warmup_iters;
  s["rows"] = rows.size();
  s["out_of_bounds"] = summary.out_of_bounds;
  s["ok"] = summary.out_of_bounds == 0;
  s["avg_busbw"] = summary.avg_busbw;
  if (summary.has_mpi) {
    s["avg_mpi_busbw"] = summary.avg_mpi_busbw;
    s["median_ratio"] = summary.median_ratio;
    s["mpi_library"] = info.mpi_library;
    s["malloc_keeps_freed"] = info.malloc_keeps_freed;
  }
  if (summary.has_gloo) {
    s["avg_gloo_ring_busbw"] = summary.avg_gloo_ring_busbw;
    s["avg_gloo_hd_busbw"] = summary.avg_gloo_hd_busbw;
    s["median_gloo_ratio"] = summary.median_gloo_ratio;
    s["gloo_library"] = info.gloo_library;
  }
  array.push_back(std::move(s));
  std::ofstream file(path);
  if (file) file << array.dump(2) << "\n";
  if (!file) {
    const int err = errno;
    throw BackendError("cannot write --json file " + path + ": " + std::strerror(err), err);
  }
}

}  // namespace mwms::bench
