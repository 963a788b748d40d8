// reduce_kernel_perf: single-thread bandwidth of the CPU reduce kernels (src/kernels) for every
// dtype x op x buffer size, once per ISA variant this CPU has, beside memcpy of the same size in
// the same run. The all-reduce calls kernels::reduce() on chunks of a few hundred KiB between
// network steps, so the kernels should keep up with memory: the memcpy column is the bar.
//
// Unlike the *_perf collective tools this one measures an internal interface (kernels::reduce and
// the detail::force_kernel_isa() hook), so it links the kernels' objects, not libmwms.so.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/aligned_buffer.h"
#include "common/flag_checks.h"
#include "common/statistics.h"
#include "kernels/reduce.h"
#include "mwms/errors.h"
#include "mwms/types.h"

namespace {

using mwms::bench::AlignedBuffer;
using mwms::bench::median;
using mwms::DataType;
using mwms::ReduceOp;
namespace mk = mwms::kernels;
using mk::detail::KernelIsa;

constexpr DataType kAllDtypes[] = {DataType::kFloat32, DataType::kFloat64,  DataType::kFloat16,
                                   DataType::kBFloat16, DataType::kInt32, DataType::kInt64};
constexpr ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMin, ReduceOp::kMax,
                                ReduceOp::kProd};
// A sample repeats the call until it has covered this many buffer bytes, so that cache-resident
// sizes are not timed one microsecond-long call at a time.
constexpr std::size_t kMinBytesPerSample = std::size_t{16} << 20;

struct Options {
  std::vector<std::size_t> bytes{std::size_t{64} << 10, std::size_t{1} << 20,
                                 std::size_t{64} << 20};
  int iters = 10;
  int warmup = 2;
  std::vector<DataType> dtypes{std::begin(kAllDtypes), std::end(kAllDtypes)};
  std::vector<ReduceOp> ops{std::begin(kAllOps), std::end(kAllOps)};
  std::string json;
};

// Values in {1, 2, -1, -2, 3}: repeated sums and products never reach subnormals (whose slow
// paths would measure the FPU, not the kernel); they may reach Inf, which costs nothing extra.
void fill(DataType dt, void* base, std::size_t count, std::size_t seed) {
  static constexpr int kValues[] = {1, 2, -1, -2, 3};
  for (std::size_t i = 0; i < count; ++i) {
    const int v = kValues[(i * 7 + seed) % 5];
    switch (dt) {
      case DataType::kFloat32: static_cast<float*>(base)[i] = static_cast<float>(v); break;
      case DataType::kFloat64: static_cast<double*>(base)[i] = v; break;
      case DataType::kFloat16:
        static_cast<std::uint16_t*>(base)[i] = mk::float_to_half(static_cast<float>(v));
        break;
      case DataType::kBFloat16:
        static_cast<std::uint16_t*>(base)[i] = mk::float_to_bfloat16(static_cast<float>(v));
        break;
      case DataType::kInt32: static_cast<std::int32_t*>(base)[i] = v; break;
      case DataType::kInt64: static_cast<std::int64_t*>(base)[i] = v; break;
    }
  }
}

// Median over `iters` samples (after `warmup` untimed ones) of the seconds one call of `fn` takes;
// each sample runs `reps` calls back to back.
template <typename Fn>
double median_seconds_per_call(const Options& o, std::size_t reps, Fn&& fn) {
  std::vector<double> samples;
  for (int it = -o.warmup; it < o.iters; ++it) {
    const auto start = std::chrono::steady_clock::now();
    for (std::size_t r = 0; r < reps; ++r) fn();
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
    if (it >= 0) samples.push_back(elapsed.count() / static_cast<double>(reps));
  }
  return median(std::move(samples));
}

std::vector<KernelIsa> available_isas() {
  std::vector<KernelIsa> isas;
  for (KernelIsa isa : mk::detail::kAllKernelIsas) {
    if (mk::detail::kernel_isa_available(isa)) isas.push_back(isa);
  }
  return isas;
}

// Elements of one reduce() per variant that differ from the baseline's, on fresh inputs. The
// inputs hold no NaN, so there is no unspecified payload to excuse (reduce.h).
std::size_t count_wrong(DataType dt, ReduceOp op, std::size_t count,
                        const std::vector<KernelIsa>& isas) {
  const std::size_t bytes = count * mwms::dtype_size(dt);
  AlignedBuffer src(bytes), want(bytes), got(bytes);
  fill(dt, src.data.get(), count, 1);
  fill(dt, want.data.get(), count, 0);
  mk::detail::force_kernel_isa(KernelIsa::kBaseline);
  mk::reduce(want.data.get(), src.data.get(), count, dt, op);
  std::size_t wrong = 0;
  const std::size_t esize = mwms::dtype_size(dt);
  for (KernelIsa isa : isas) {
    fill(dt, got.data.get(), count, 0);
    mk::detail::force_kernel_isa(isa);
    mk::reduce(got.data.get(), src.data.get(), count, dt, op);
    for (std::size_t i = 0; i < count; ++i) {
      wrong += std::memcmp(got.data.get() + i * esize, want.data.get() + i * esize, esize) != 0;
    }
  }
  mk::detail::force_kernel_isa(std::nullopt);
  return wrong;
}

struct Row {
  std::size_t bytes;
  std::size_t count;
  DataType dtype;
  ReduceOp op;
  std::vector<std::optional<double>> gbps;  // per KernelIsa, empty where unavailable
  double memcpy_gbps;
  std::size_t wrong;
};

Row measure(const Options& o, std::size_t bytes_wanted, DataType dt, ReduceOp op,
            double memcpy_gbps) {
  const std::size_t esize = mwms::dtype_size(dt);
  const std::size_t count = bytes_wanted / esize;
  const std::size_t bytes = count * esize;
  const std::size_t reps = std::max<std::size_t>(1, kMinBytesPerSample / bytes);
  Row row{bytes, count, dt, op, {}, memcpy_gbps, 0};
  const std::vector<KernelIsa> isas = available_isas();
  row.wrong = count_wrong(dt, op, count, isas);
  AlignedBuffer dst(bytes), src(bytes);
  fill(dt, src.data.get(), count, 1);
  for (KernelIsa isa : mk::detail::kAllKernelIsas) {
    if (!mk::detail::kernel_isa_available(isa)) {
      row.gbps.emplace_back();
      continue;
    }
    fill(dt, dst.data.get(), count, 0);
    mk::detail::force_kernel_isa(isa);
    const double s = median_seconds_per_call(
        o, reps, [&] { mk::reduce(dst.data.get(), src.data.get(), count, dt, op); });
    row.gbps.emplace_back(3.0 * static_cast<double>(bytes) / s / 1e9);
  }
  mk::detail::force_kernel_isa(std::nullopt);
  return row;
}

double measure_memcpy(const Options& o, std::size_t bytes) {
  AlignedBuffer dst(bytes), src(bytes);
  std::memset(src.data.get(), 1, bytes);
  const std::size_t reps = std::max<std::size_t>(1, kMinBytesPerSample / bytes);
  const double s = median_seconds_per_call(o, reps, [&] {
    std::memcpy(dst.data.get(), src.data.get(), bytes);
    // Keep the copy observable so that the repetitions are not folded into one.
    asm volatile("" : : "r"(dst.data.get()) : "memory");
  });
  return 2.0 * static_cast<double>(bytes) / s / 1e9;
}

void print_header(const Options& o) {
  std::printf("# reduce_kernel_perf: kernels::reduce(dst, src, count) per ISA variant, 1 thread\n");
  std::printf("# reduce GB/s = 3 x bytes / time per call (dst and src read, dst written);\n");
  std::printf("# memcpy GB/s = 2 x bytes / time per call (src read, dst written), same size;\n");
  std::printf("# GB/s = 1e9 B/s; median of %d samples, each >= %zu MiB of calls back to back\n",
              o.iters, kMinBytesPerSample >> 20);
  std::printf("# variants on this CPU:");
  for (KernelIsa isa : available_isas()) std::printf(" %s", mk::detail::to_string(isa).data());
  std::printf(" (all-reduce uses %s); n/a = not available here\n",
              mk::detail::to_string(mk::detail::active_kernel_isa()).data());
  std::printf("#%13s %12s %9s %6s", "bytes", "count", "type", "redop");
  for (KernelIsa isa : mk::detail::kAllKernelIsas) {
    std::printf(" %9s", mk::detail::to_string(isa).data());
  }
  std::printf(" %9s %7s\n", "memcpy", "#wrong");
}

void print_row(const Row& r) {
  std::printf("%14zu %12zu %9s %6s", r.bytes, r.count, mwms::to_string(r.dtype).data(),
              mwms::to_string(r.op).data());
  for (const auto& g : r.gbps) {
    if (g) {
      std::printf(" %9.2f", *g);
    } else {
      std::printf(" %9s", "n/a");
    }
  }
  std::printf(" %9.2f %7zu\n", r.memcpy_gbps, r.wrong);
  std::fflush(stdout);
}

void write_json(const std::string& path, const std::vector<Row>& rows) {
  nlohmann::json out = nlohmann::json::array();
  for (const Row& r : rows) {
    for (std::size_t v = 0; v < r.gbps.size(); ++v) {
      if (!r.gbps[v]) continue;
      out.push_back({{"bytes", r.bytes},
                     {"count", r.count},
                     {"dtype", mwms::to_string(r.dtype)},
                     {"op", mwms::to_string(r.op)},
                     {"isa", mk::detail::to_string(mk::detail::kAllKernelIsas[v])},
                     {"reduce_gbps", *r.gbps[v]},
                     {"memcpy_gbps", r.memcpy_gbps},
                     {"wrong", r.wrong}});
    }
  }
  std::ofstream f(path);
  f << out.dump(1) << "\n";
  if (!f) throw mwms::InvalidArgument("cannot write --json file " + path);
}

// Returns the exit status when the program should stop now (help, bad flags), else nullopt.
std::optional<int> parse(int argc, char** argv, Options& o) {
  CLI::App app{"reduce_kernel_perf: bandwidth of the CPU reduce kernels per ISA variant"};
  std::vector<std::string> dtypes, ops;
  app.add_option("-b,--bytes", o.bytes, "Buffer sizes in bytes, comma-separated (K/M/G = 1024^n)")
      ->delimiter(',')
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  app.add_option("-n,--iters", o.iters, "Timed samples per row (the median is printed)")
      ->capture_default_str();
  app.add_option("-w,--warmup", o.warmup, "Untimed samples before them")->capture_default_str();
  app.add_option("-d,--dtype", dtypes, "Only these dtypes (comma-separated; default all)")
      ->delimiter(',');
  app.add_option("-o,--op", ops, "Only these ops (comma-separated; default all)")->delimiter(',');
  app.add_option("--json", o.json, "Also write the rows as a JSON array to this file");
  try {
    app.parse(argc, argv);
    mwms::bench::check_flag_at_least("-n/--iters", o.iters, 1);
    mwms::bench::check_flag_at_least("-w/--warmup", o.warmup, 0);
    if (!dtypes.empty()) {
      o.dtypes.clear();
      for (const auto& d : dtypes) o.dtypes.push_back(mwms::parse_dtype(d));
    }
    if (!ops.empty()) {
      o.ops.clear();
      for (const auto& op : ops) o.ops.push_back(mwms::parse_reduce_op(op));
    }
    for (std::size_t b : o.bytes) {
      if (b < 8) throw mwms::InvalidArgument("--bytes " + std::to_string(b) + " is below 8");
    }
  } catch (const CLI::ParseError& e) {
    const int status = app.exit(e);
    return status == 0 ? 0 : 2;
  } catch (const mwms::Error& e) {
    std::cerr << "reduce_kernel_perf: " << e.what() << "\n";
    return 2;
  }
  return std::nullopt;
}

}  // namespace

// Exit status: 0 when every variant matched the baseline, 1 when any element differed, 2 on a
// usage error.
int main(int argc, char** argv) {
  Options o;
  if (const std::optional<int> stop = parse(argc, argv, o)) return *stop;
  print_header(o);
  std::vector<Row> rows;
  std::size_t wrong = 0;
  for (std::size_t bytes : o.bytes) {
    const double memcpy_gbps = measure_memcpy(o, bytes);
    for (DataType dt : o.dtypes) {
      for (ReduceOp op : o.ops) {
        rows.push_back(measure(o, bytes, dt, op, memcpy_gbps));
        print_row(rows.back());
        wrong += rows.back().wrong;
      }
    }
  }
  std::printf("# variants that differ from baseline: %zu elements%s\n", wrong,
              wrong == 0 ? " (OK)" : "");
  if (!o.json.empty()) {
    try {
      write_json(o.json, rows);
    } catch (const mwms::Error& e) {
      std::cerr << "reduce_kernel_perf: " << e.what() << "\n";
      return 2;
    }
  }
  return wrong == 0 ? 0 : 1;
}
