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

// Same bytes and bus factor on both sides, so this is busbw / nccl busbw, and it stays defined on
// one rank, where the all-reduce factor 2(n-1)/n makes both busbw 0 (gpu_check.sh's case).
double nccl_ratio(const ResultRow& row) {
  return row.time_us > 0 ? row.nccl_time_us / row.time_us : 0;
}

double bucket_speedup(const BucketRow& row) {
  return row.bucketed_time_us > 0 ? row.separate_time_us / row.bucketed_time_us : 0;
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
// Gloo's times like MPI's: each algorithm's time, then its busbw.
const Column kGlooColumns[] = {{"ring time", "(us)", 9},
                               {"ring busbw", "(GB/s)", 10},
                               {"hd time", "(us)", 9},
                               {"hd busbw", "(GB/s)", 9},
                               {"vs gloo", "", 7}};
const Column kNcclColumns[] = {
    {"nccl time", "(us)", 9}, {"nccl busbw", "(GB/s)", 10}, {"vs nccl", "", 7}};

template <typename Pick>
void print_header_line(std::ostream& out, bool with_mpi, bool with_gloo, bool with_nccl,
                       Pick pick) {
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
  if (with_nccl) {
    for (const Column& c : kNcclColumns) out << "  " << std::setw(c.width) << pick(c);
  }
  out << "\n";
}

}  // namespace

// Layout follows nccl-tests (right-aligned, '#' header lines) so that scripts written for its
// output keep working.
void print_table_header(std::ostream& out, bool with_mpi, bool with_gloo, bool with_nccl) {
  print_header_line(out, with_mpi, with_gloo, with_nccl, [](const Column& c) { return c.name; });
  print_header_line(out, with_mpi, with_gloo, with_nccl, [](const Column& c) { return c.unit; });
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
    out << "  " << std::setw(g[0].width) << row.gloo_ring_time_us << "  " << std::setw(g[1].width)
        << row.gloo_ring_busbw << "  " << std::setw(g[2].width) << row.gloo_hd_time_us << "  "
        << std::setw(g[3].width) << row.gloo_hd_busbw << "  " << std::setw(g[4].width)
        << gloo_ratio(row);
  }
  if (row.has_nccl) {
    const Column* c = kNcclColumns;
    out << "  " << std::setw(c[0].width) << row.nccl_time_us << "  " << std::setw(c[1].width)
        << row.nccl_busbw << "  " << std::setw(c[2].width) << nccl_ratio(row);
  }
  out << std::defaultfloat << "\n" << std::flush;
}

Summary summarize(const std::vector<ResultRow>& rows) {
  Summary s;
  std::vector<double> busbw, mpi_busbw, ratios, ring, hd, gloo_ratios, nccl, nccl_ratios,
      nccl_large_ratios;
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
    if (row.has_nccl) {
      nccl.push_back(row.nccl_busbw);
      nccl_ratios.push_back(nccl_ratio(row));
      if (row.bytes >= kNcclTargetBytes) nccl_large_ratios.push_back(nccl_ratio(row));
    }
  }
  s.has_nccl = !nccl.empty();
  s.avg_nccl_busbw = mean(nccl);
  s.median_nccl_ratio = median(nccl_ratios);
  s.median_nccl_ratio_large = nccl_large_ratios.empty() ? -1 : median(nccl_large_ratios);
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

void write_file(const std::string& path, const nlohmann::ordered_json& array) {
  std::ofstream file(path);
  if (file) file << array.dump(2) << "\n";
  if (!file) {
    const int err = errno;
    throw BackendError("cannot write --json file " + path + ": " + std::strerror(err), err);
  }
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
  if (s.has_nccl) {
    label(out, "Avg NCCL busbw") << s.avg_nccl_busbw << " \n";
    label(out, "Median vs NCCL") << s.median_nccl_ratio
                                 << " (libmwms busbw / raw NCCL busbw = nccl time / time)\n";
    label(out, "Median vs NCCL 16M+");
    if (s.median_nccl_ratio_large < 0) {
      out << "n/a (no row of 16 MiB or more)\n";
    } else {
      out << s.median_nccl_ratio_large << " (rows of 16 MiB or more; target >= 0.97)\n";
    }
  }
  out << "#\n" << std::flush;
}

void write_json(const std::string& path, const std::vector<ResultRow>& rows, const RunInfo& info,
                const Summary& summary, const SweepFailure* failure) {
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
    if (row.has_nccl) {
      o["nccl_time_us"] = row.nccl_time_us;
      o["nccl_busbw"] = row.nccl_busbw;
      o["nccl_ratio"] = nccl_ratio(row);
    }
    array.push_back(std::move(o));
  }
  if (failure != nullptr) {
    nlohmann::ordered_json f;
    f["record"] = "failure";
    f["collective"] = info.collective;
    f["size"] = failure->bytes;
    f["count"] = failure->count;
    f["type"] = failure->type;
    f["redop"] = failure->redop;
    f["ranks"] = info.ranks;
    f["backend"] = info.backend;
    f["error"] = failure->error;
    array.push_back(std::move(f));
  }
  nlohmann::ordered_json s;
  s["record"] = "summary";
  s["collective"] = info.collective;
  s["ranks"] = info.ranks;
  s["backend"] = info.backend;
  s["describe"] = info.describe;
  s["iters"] = info.iters;
  s["warmup_iters"] = info.warmup_iters;
  nlohmann::ordered_json environment = nlohmann::ordered_json::object();
  for (const EnvSetting& e : info.environment) environment[e.name] = e.value;
  s["environment"] = std::move(environment);
  s["rows"] = rows.size();
  s["complete"] = failure == nullptr;
  s["out_of_bounds"] = summary.out_of_bounds;
  s["ok"] = failure == nullptr && summary.out_of_bounds == 0;
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
  if (!info.nccl_library.empty()) s["nccl_library"] = info.nccl_library;
  if (summary.has_nccl) {
    s["avg_nccl_busbw"] = summary.avg_nccl_busbw;
    s["median_nccl_ratio"] = summary.median_nccl_ratio;
    s["median_nccl_ratio_16m"] = summary.median_nccl_ratio_large < 0
                                     ? nlohmann::ordered_json(nullptr)
                                     : nlohmann::ordered_json(summary.median_nccl_ratio_large);
  }
  array.push_back(std::move(s));
  write_file(path, array);
}

namespace {

const Column kBucketColumns[] = {{"tensors", "", 7},     {"size", "(B)", 10},
                                 {"smallest", "(B)", 8}, {"largest", "(B)", 8},
                                 {"type", "", 8},        {"redop", "", 5},
                                 {"buckets", "", 7},     {"bucket time", "(us)", 11},
                                 {"busbw", "(GB/s)", 7}, {"separate time", "(us)", 13},
                                 {"busbw", "(GB/s)", 7}, {"speedup", "", 7},
                                 {"#wrong", "", 6}};

}  // namespace

void print_bucket_table(std::ostream& out, const BucketRow& row) {
  for (int line = 0; line < 2; ++line) {
    out << "#";
    bool first = true;
    for (const Column& c : kBucketColumns) {
      out << (first ? " " : "  ") << std::setw(c.width) << (line == 0 ? c.name : c.unit);
      first = false;
    }
    out << "\n";
  }
  const Column* c = kBucketColumns;
  out << "  " << std::setw(c[0].width) << row.tensors << "  " << std::setw(c[1].width) << row.bytes
      << "  " << std::setw(c[2].width) << row.smallest_bytes << "  " << std::setw(c[3].width)
      << row.largest_bytes << "  " << std::setw(c[4].width) << row.type << "  "
      << std::setw(c[5].width) << row.redop << "  " << std::setw(c[6].width) << row.buckets
      << std::fixed << std::setprecision(2) << "  " << std::setw(c[7].width) << row.bucketed_time_us
      << "  " << std::setw(c[8].width) << row.bucketed_busbw << "  " << std::setw(c[9].width)
      << row.separate_time_us << "  " << std::setw(c[10].width) << row.separate_busbw << "  "
      << std::setw(c[11].width) << bucket_speedup(row) << "  " << std::setw(c[12].width);
  if (row.wrong < 0) {
    out << "N/A";
  } else {
    out << row.wrong;
  }
  out << std::defaultfloat << std::setprecision(6) << "\n";
  const std::int64_t wrong = row.wrong > 0 ? row.wrong : 0;
  label(out, "Out of bounds values") << wrong << (wrong == 0 ? " OK" : " FAILED") << "\n";
  label(out, "Bucket speedup")
      << bucket_speedup(row)
      << " (separate / bucketed time; the >= 5 target is for 200 tensors, 25 MiB, on GPUs)\n";
  out << "#\n" << std::flush;
}

void write_bucket_json(const std::string& path, const BucketRow& row, const BucketRunInfo& info) {
  nlohmann::ordered_json o;
  o["record"] = "row";
  o["tool"] = "bucket_perf";
  o["buffers"] = info.buffers;
  o["ranks"] = info.ranks;
  o["backend"] = info.backend;
  o["describe"] = info.describe;
  o["tensors"] = row.tensors;
  o["size"] = row.bytes;
  o["smallest"] = row.smallest_bytes;
  o["largest"] = row.largest_bytes;
  o["type"] = row.type;
  o["redop"] = row.redop;
  o["bytes_per_pack"] = info.bytes_per_pack;
  o["buckets"] = row.buckets;
  o["bucketed_time_us"] = row.bucketed_time_us;
  o["bucketed_busbw"] = row.bucketed_busbw;
  o["separate_time_us"] = row.separate_time_us;
  o["separate_busbw"] = row.separate_busbw;
  o["speedup"] = bucket_speedup(row);
  o["wrong"] = row.wrong < 0 ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(row.wrong);
  o["iters"] = info.iters;
  o["warmup_iters"] = info.warmup_iters;
  nlohmann::ordered_json environment = nlohmann::ordered_json::object();
  for (const EnvSetting& e : info.environment) environment[e.name] = e.value;
  o["environment"] = std::move(environment);
  nlohmann::ordered_json array = nlohmann::ordered_json::array();
  array.push_back(std::move(o));
  write_file(path, array);
}

}  // namespace mwms::bench
