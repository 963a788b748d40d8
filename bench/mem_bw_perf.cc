// mem_bw_perf: this machine's memory bandwidth for the passes an all-reduce makes over memory
// (read, write, memcpy, and the reduce kernel dst += src), on 1..T threads at once, each thread
// on buffers of its own as each rank has its own. docs/PERFORMANCE.md ("Memory-traffic bound")
// turns these rates into busbw bounds for an all-reduce of n ranks (issue 18, item 3), measured
// with n threads at once:
//   in-place minimum: every rank reads and writes its buffer once, at the memcpy traffic rate m
//     (GB/s per thread): algbw <= m / 2, busbw <= m / 2 x 2(n-1)/n
//   the copy-in/copy-out ring if every pass went to memory: busbw <= 2 / (3 / c + 1 / r), with
//     c = m / 2 bytes copied and r = dst bytes reduced per second per thread.
//
// Like reduce_kernel_perf it calls the kernels' internal interface (kernels::reduce), so it links
// the kernels' objects, not libmwms.so. Not installed: a developer tool.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
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
namespace mk = mwms::kernels;

struct Options {
  std::size_t bytes = std::size_t{256} << 20;  // per thread, per buffer: far above any LLC here
  std::vector<int> threads{1, 2};
  int iters = 7;
  int warmup = 1;
  std::string json;
};

// The passes, and the bytes each moves through memory per buffer byte (reads + writes, not
// counting the read-for-ownership a cached store also makes).
enum class Pass { kRead, kWrite, kCopy, kReduce };
constexpr Pass kAllPasses[] = {Pass::kRead, Pass::kWrite, Pass::kCopy, Pass::kReduce};
const char* name_of(Pass p) {
  switch (p) {
    case Pass::kRead:
      return "read";
    case Pass::kWrite:
      return "write";
    case Pass::kCopy:
      return "memcpy";
    case Pass::kReduce:
      return "reduce";
  }
  return "?";
}
double traffic_per_byte(Pass p) { return p == Pass::kCopy ? 2.0 : p == Pass::kReduce ? 3.0 : 1.0; }

// One thread's buffers. float32 ones (small integers: sums stay exact and never subnormal).
struct Lane {
  explicit Lane(std::size_t bytes) : src(bytes), dst(bytes) {
    auto* s = reinterpret_cast<float*>(src.data.get());
    for (std::size_t i = 0; i < src.size / sizeof(float); ++i) s[i] = static_cast<float>(i % 3);
  }
  AlignedBuffer src, dst;
  std::uint64_t sink = 0;
  int reduced = 0;  // reduce passes since the last memcpy pass set dst = src

  // Elements of dst that differ from src x (1 + reduced), exact in float32 for these values.
  std::size_t count_wrong() const {
    const auto* s = reinterpret_cast<const float*>(src.data.get());
    const auto* d = reinterpret_cast<const float*>(dst.data.get());
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < src.size / sizeof(float); ++i) {
      wrong += d[i] != s[i] * static_cast<float>(1 + reduced);
    }
    return wrong;
  }
};

void run_pass(Pass p, Lane& l) {
  const std::size_t n = l.src.size;
  switch (p) {
    case Pass::kRead: {
      const auto* w = reinterpret_cast<const std::uint64_t*>(l.src.data.get());
      std::uint64_t a = 0, b = 0, c = 0, d = 0;  // four chains: the loads, not the adds, bound it
      for (std::size_t i = 0; i + 4 <= n / 8; i += 4) {
        a += w[i];
        b += w[i + 1];
        c += w[i + 2];
        d += w[i + 3];
      }
      l.sink += a + b + c + d;
      break;
    }
    case Pass::kWrite:
      std::memset(l.dst.data.get(), static_cast<int>(l.sink & 1), n);
      break;
    case Pass::kCopy:
      std::memcpy(l.dst.data.get(), l.src.data.get(), n);
      l.reduced = 0;
      break;
    case Pass::kReduce:
      mk::reduce(l.dst.data.get(), l.src.data.get(), n / sizeof(float), mwms::DataType::kFloat32,
                 mwms::ReduceOp::kSum);
      break;
  }
  asm volatile("" : : "r"(l.dst.data.get()) : "memory");  // the pass is observable
}

struct Row {
  int threads;
  Pass pass;
  double gbps_per_thread;  // traffic / time of the slowest thread
  double gbps_total;
};

// Every thread runs the pass once per sample, all released together; a sample lasts until the
// slowest has finished (as a collective does). Median over the samples.
Row measure(const Options& o, int threads, Pass p, std::vector<std::unique_ptr<Lane>>& lanes) {
  std::vector<double> samples;
  for (int it = -o.warmup; it < o.iters; ++it) {
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        ready.fetch_add(1);
        while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
        run_pass(p, *lanes[static_cast<std::size_t>(t)]);
      });
    }
    while (ready.load() < threads) std::this_thread::yield();
    const auto start = std::chrono::steady_clock::now();
    go.store(true, std::memory_order_release);
    for (auto& th : pool) th.join();
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
    if (it >= 0) samples.push_back(elapsed.count());
  }
  if (p == Pass::kReduce) {
    for (int t = 0; t < threads; ++t)
      lanes[static_cast<std::size_t>(t)]->reduced += o.warmup + o.iters;
  }
  const double s = median(std::move(samples));
  const double per_thread = traffic_per_byte(p) * static_cast<double>(o.bytes) / s / 1e9;
  return Row{threads, p, per_thread, per_thread * threads};
}

std::optional<int> parse(int argc, char** argv, Options& o) {
  CLI::App app{"mem_bw_perf: memory bandwidth of read, write, memcpy and reduce per thread"};
  app.add_option("-b,--bytes", o.bytes, "Buffer bytes per thread (K/M/G = 1024^n)")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  app.add_option("-t,--threads", o.threads, "Thread counts, comma-separated")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("-n,--iters", o.iters, "Timed samples per row (the median is printed)")
      ->capture_default_str();
  app.add_option("-w,--warmup", o.warmup, "Untimed samples before them")->capture_default_str();
  app.add_option("--json", o.json, "Also write the rows as a JSON array to this file");
  try {
    app.parse(argc, argv);
    mwms::bench::check_flag_at_least("-n/--iters", o.iters, 1);
    mwms::bench::check_flag_at_least("-w/--warmup", o.warmup, 0);
    if (o.bytes < 4096) {
      throw mwms::InvalidArgument("--bytes " + std::to_string(o.bytes) + " is below 4096");
    }
    for (int t : o.threads) mwms::bench::check_flag_at_least("-t/--threads", t, 1);
  } catch (const CLI::ParseError& e) {
    const int status = app.exit(e);
    return status == 0 ? 0 : 2;
  } catch (const mwms::Error& e) {
    std::cerr << "mem_bw_perf: " << e.what() << "\n";
    return 2;
  }
  return std::nullopt;
}

}  // namespace

// Exit status: 0; 1 when a reduce pass left a wrong element; 2 on a usage error (or a --json
// file that cannot be written).
int main(int argc, char** argv) {
  Options o;
  if (const std::optional<int> stop = parse(argc, argv, o)) return *stop;
  std::printf(
      "# mem_bw_perf: %zu MiB per buffer per thread; GB/s = 1e9 B/s of traffic (reads + "
      "writes: read 1x, write 1x, memcpy 2x, reduce 3x the buffer) over the time of the "
      "slowest thread; median of %d samples; %u CPUs online\n",
      o.bytes >> 20, o.iters, std::thread::hardware_concurrency());
  std::printf("#%7s %8s %14s %12s\n", "threads", "pass", "GB/s/thread", "GB/s total");
  std::vector<Row> rows;
  std::vector<std::unique_ptr<Lane>> lanes;
  std::size_t wrong = 0;
  for (int threads : o.threads) {
    while (static_cast<int>(lanes.size()) < threads)
      lanes.push_back(std::make_unique<Lane>(o.bytes));
    for (Pass p : kAllPasses) {
      rows.push_back(measure(o, threads, p, lanes));
      const Row& r = rows.back();
      std::printf("%8d %8s %14.2f %12.2f\n", r.threads, name_of(r.pass), r.gbps_per_thread,
                  r.gbps_total);
      std::fflush(stdout);
    }
    for (int t = 0; t < threads; ++t) wrong += lanes[static_cast<std::size_t>(t)]->count_wrong();
    // The two busbw bounds of docs/PERFORMANCE.md ("Memory-traffic bound") at this many ranks.
    const double copy_traffic = rows[rows.size() - 2].gbps_per_thread;
    const double copy_rate = copy_traffic / 2.0;
    const double reduce_rate = rows.back().gbps_per_thread / 3.0;
    if (threads > 1) {
      std::printf(
          "# %d ranks: in-place minimum (each rank reads and writes its buffer once, at "
          "the memcpy traffic rate): busbw <= %.2f x %d/%d = %.2f GB/s\n",
          threads, copy_traffic / 2.0, 2 * (threads - 1), threads,
          copy_traffic / 2.0 * 2.0 * (threads - 1) / threads);
    }
    std::printf(
        "# %d rank(s): copy-in/copy-out ring with every pass in memory: busbw <= "
        "2 / (3 / %.2f + 1 / %.2f) = %.2f GB/s\n",
        threads, copy_rate, reduce_rate, 2.0 / (3.0 / copy_rate + 1.0 / reduce_rate));
  }
  std::printf("# reduce results checked: %zu wrong elements%s\n", wrong, wrong == 0 ? " (OK)" : "");
  if (!o.json.empty()) {
    nlohmann::json out = nlohmann::json::array();
    for (const Row& r : rows) {
      out.push_back({{"bytes", o.bytes},
                     {"threads", r.threads},
                     {"pass", name_of(r.pass)},
                     {"gbps_per_thread", r.gbps_per_thread},
                     {"gbps_total", r.gbps_total}});
    }
    std::ofstream f(o.json);
    f << out.dump(1) << "\n";
    if (!f) {
      std::cerr << "mem_bw_perf: cannot write --json file " << o.json << "\n";
      return 2;
    }
  }
  return wrong == 0 ? 0 : 1;
}
