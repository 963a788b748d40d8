// ps_perf: the parameter-server mode's step, push + pull (ParameterServerStrategy::
// apply_gradients), timed in the nccl-tests style over model sizes, for any number of workers and
// ps tasks, synchronous or asynchronous. Launch it as a parameter-server job:
//   mwmsrun -np 2 --ps 1 -- build/bin/ps_perf -b 64K -e 64M -f 4
//   mwmsrun -np 2 --ps 1 -- build/bin/ps_perf --model mlp      # the MLP of `train` (814 KB)
// Each size is one job (every task builds a ParameterServerStrategy, the workers declare
// --vars variables that hold the size between them, the chief initialises them, every worker
// pushes and pulls -w + -n times, then says goodbye and the ps tasks return from join()), so
// every row starts from fresh variables. Time: the median over the -n steps of the chief's
// push + pull; algbw: the bytes one worker moves per step (gradients out, values in: 2 x size)
// over that time. -c 1 (synchronous mode) checks every value after the steps against the exact
// expected one (SGD, lr 0.25, every worker's gradient 1: each step subtracts 0.25).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/statistics.h"
#include "mwms/mwms.h"

namespace {

struct Flags {
  std::string min_bytes = "64K";
  std::string max_bytes = "16M";
  double factor = 4;
  int iters = 20;
  int warmup = 5;
  int vars = 4;
  bool sync = false;
  int check = 1;
  std::string model;
  std::string json;
  int num_ps_partitions = 0;
};

std::size_t parse_bytes(const std::string& text) {
  std::size_t pos = 0;
  const double v = std::stod(text, &pos);
  double mult = 1;
  if (pos < text.size()) {
    switch (text[pos]) {
      case 'K': case 'k': mult = 1024; break;
      case 'M': case 'm': mult = 1024.0 * 1024; break;
      case 'G': case 'g': mult = 1024.0 * 1024 * 1024; break;
      default: throw std::invalid_argument("bad size " + text);
    }
    if (pos + 1 != text.size()) throw std::invalid_argument("bad size " + text);
  }
  if (!(v > 0)) throw std::invalid_argument("bad size " + text);
  return static_cast<std::size_t>(v * mult);
}

struct Row {
  std::size_t bytes = 0;
  std::size_t vars = 0;
  double time_us = 0;
  double p99_us = 0;
  double algbw = 0;
  long long wrong = -1;  // -1: not checked
  long long dropped = 0;
};

// One job: returns the chief's row (workers), nothing on a ps.
Row run_size(const mwms::ResolvedCluster& cluster, const Flags& f,
             const std::vector<std::vector<std::int64_t>>& shapes, bool* is_chief) {
  mwms::ParameterServerOptions o;
  o.sync_replicas = f.sync;
  o.optimizer.kind = mwms::OptimizerKind::kSgd;
  o.optimizer.learning_rate = 0.25;
  if (f.num_ps_partitions > 0) o.partitioner = mwms::Partitioner::fixed_size(f.num_ps_partitions);
  mwms::ParameterServerStrategy s(cluster, o);
  Row row;
  *is_chief = s.is_chief();
  if (s.is_ps()) {
    s.join();
    return row;
  }
  std::vector<std::vector<float>> values, grads;
  for (std::size_t v = 0; v < shapes.size(); ++v) {
    std::size_t n = 1;
    for (auto d : shapes[v]) n *= static_cast<std::size_t>(d);
    values.emplace_back(n, 0.0f);
    grads.emplace_back(n, 1.0f);
    s.create_variable({"v" + std::to_string(v), shapes[v]}, values.back().data(),
                      grads.back().data());
    row.bytes += n * sizeof(float);
  }
  row.vars = shapes.size();
  s.initialize();
  std::vector<double> times;
  // Asynchronous: a worker slower than the chief is stopped when the chief ends the job.
  for (int i = 0; i < f.warmup + f.iters && !s.should_stop(); ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    s.apply_gradients();
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    if (i >= f.warmup) times.push_back(us);
  }
  if (f.sync && f.check) {
    row.wrong = 0;
    float want = 0;
    for (int i = 0; i < f.warmup + f.iters; ++i) want -= 0.25f * 1.0f;
    for (const auto& v : values) {
      row.wrong += static_cast<long long>(std::count_if(v.begin(), v.end(),
                                                        [&](float x) { return x != want; }));
    }
  }
  row.dropped = s.stats().dropped_stale;
  s.finalize();
  row.time_us = mwms::bench::median(times);
  std::sort(times.begin(), times.end());
  row.p99_us = times.empty() ? 0 : times[std::min(times.size() - 1, times.size() * 99 / 100)];
  row.algbw = mwms::bench::gb_per_s(2.0 * static_cast<double>(row.bytes), row.time_us);
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  CLI::App app{"ps_perf: parameter-server push + pull per step (nccl-tests style); run it as a "
               "ps job, e.g. mwmsrun -np 2 --ps 1 -- ps_perf"};
  app.add_option("-b,--minbytes", f.min_bytes, "smallest model size (K, M, G suffixes)")
      ->capture_default_str();
  app.add_option("-e,--maxbytes", f.max_bytes, "largest model size")->capture_default_str();
  app.add_option("-f,--stepfactor", f.factor, "size multiplier between rows")
      ->check(CLI::Range(1.01, 1024.0))
      ->capture_default_str();
  app.add_option("-n,--iters", f.iters, "timed steps per size")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  app.add_option("-w,--warmup_iters", f.warmup, "untimed steps first")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  app.add_option("--vars", f.vars, "variables the model size is split into (equal parts)")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--partitions", f.num_ps_partitions,
                 "fixed_size_partitioner(N) on every variable (0: none)")
      ->check(CLI::Range(0, 4096))
      ->capture_default_str();
  app.add_flag("--sync", f.sync, "synchronous mode (SyncReplicasOptimizer); default: async");
  app.add_option("-c,--check", f.check, "synchronous mode: check every value after the steps")
      ->check(CLI::Range(0, 1))
      ->capture_default_str();
  app.add_option("--model", f.model, "mlp: the 4 tensors of train's MLP (784-256-10, 814 KB) "
                 "instead of the size sweep")
      ->check(CLI::IsMember({"", "mlp"}));
  app.add_option("--json", f.json, "also write the rows as JSON to this file");
  CLI11_PARSE(app, argc, argv);
  try {
    std::vector<std::vector<std::vector<std::int64_t>>> models;
    if (f.model == "mlp") {
      models.push_back({{784, 256}, {256}, {256, 10}, {10}});
    } else {
      const std::size_t lo = parse_bytes(f.min_bytes), hi = parse_bytes(f.max_bytes);
      if (lo > hi) throw std::invalid_argument("-b is larger than -e");
      for (double b = static_cast<double>(lo); b <= static_cast<double>(hi) * 1.0000001;
           b *= f.factor) {
        const std::size_t count = std::max<std::size_t>(
            static_cast<std::size_t>(f.vars), static_cast<std::size_t>(b) / sizeof(float));
        std::vector<std::vector<std::int64_t>> shapes;
        for (int v = 0; v < f.vars; ++v) {
          const std::size_t part = count / f.vars + (static_cast<std::size_t>(v) < count % f.vars);
          shapes.push_back({static_cast<std::int64_t>(part)});
        }
        models.push_back(shapes);
      }
    }
    const mwms::ResolvedCluster cluster = mwms::resolve_from_environment();
    nlohmann::json rows = nlohmann::json::array();
    bool header = false;
    for (const auto& shapes : models) {
      bool chief = false;
      const Row r = run_size(cluster, f, shapes, &chief);
      if (!chief) continue;
      if (!header) {
        std::printf("# ps_perf: %d worker(s), %d ps, %s, SGD; time = median push+pull of the "
                    "chief, algbw = 2 x size / time\n",
                    cluster.num_workers, cluster.num_ps, f.sync ? "sync" : "async");
        std::printf("%12s %8s %12s %12s %10s %8s %8s\n", "size(B)", "vars", "time(us)",
                    "p99(us)", "algbw", "dropped", "#wrong");
        header = true;
      }
      std::printf("%12zu %8zu %12.1f %12.1f %10.3f %8lld %8s\n", r.bytes, r.vars, r.time_us,
                  r.p99_us, r.algbw, r.dropped,
                  r.wrong < 0 ? "n/a" : std::to_string(r.wrong).c_str());
      std::fflush(stdout);
      rows.push_back({{"bytes", r.bytes}, {"vars", r.vars}, {"time_us", r.time_us},
                      {"p99_us", r.p99_us}, {"algbw_gbps", r.algbw}, {"dropped", r.dropped},
                      {"wrong", r.wrong}, {"mode", f.sync ? "sync" : "async"},
                      {"workers", cluster.num_workers}, {"ps", cluster.num_ps}});
      if (r.wrong > 0) {
        std::fprintf(stderr, "ps_perf: %lld wrong values at %zu bytes\n", r.wrong, r.bytes);
        return 1;
      }
    }
    if (!f.json.empty() && header) {
      std::ofstream out(f.json);
      out << rows.dump(1) << "\n";
      if (!out) throw std::runtime_error("cannot write " + f.json);
    }
  } catch (const mwms::Error& e) {
    std::cerr << "ps_perf: error: " << e.what() << std::endl;
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "ps_perf: error: " << e.what() << std::endl;
    return 2;
  }
  return 0;
}
