// algorithm_ab: the all-reduce time of several algorithms (MWMS_ALGO names, or auto) in one job,
// one communicator per algorithm, in interleaved blocks: block b of every algorithm runs before
// block b + 1 of any, so each algorithm's median is over the same stretch of this noisy machine
// (Note [interleaved comparison] in bench/common/driver.cc, at the grain of a block: a call
// that follows another library's call would also wait out the skew between the ranks that the
// other call left, which at 0.2 us is most of the time). The figures of the flat all-reduce in
// docs/algorithms.md and docs/PERFORMANCE.md come from it:
//   mpirun -np 2 build/bin/algorithm_ab --algos rd,flat -b 4 -e 4K -f 4
// Per size: each algorithm's median over blocks of the block's time per call, the slowest rank's
// (the times are max-reduced over ranks); ratio = the first algorithm's time / this one's.
// Float32 sum in place, one array per size. Launch like any libmwms job (mpirun, mwmsrun,
// TF_CONFIG). Exit status: 0; 1 when a result is wrong; 2 on a usage error.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/flag_checks.h"
#include "mwms/mwms.h"

namespace {

struct Options {
  std::vector<std::string> algos{"rd", "flat"};
  std::size_t min_bytes = 4;
  std::size_t max_bytes = 4096;
  int factor = 4;
  int iters = 2000;  // calls per block
  int blocks = 15;
  std::string json;
};

std::optional<int> parse(int argc, char** argv, Options& o) {
  CLI::App app{"algorithm_ab: all-reduce time per algorithm, interleaved blocks in one job"};
  app.add_option("--algos", o.algos, "MWMS_ALGO names (or auto), comma-separated")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("-b,--minbytes", o.min_bytes, "Smallest message (K/M/G = 1024^n)")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  app.add_option("-e,--maxbytes", o.max_bytes, "Largest message")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  app.add_option("-f,--stepfactor", o.factor, "Multiply the size by this per row")
      ->capture_default_str();
  app.add_option("-n,--iters", o.iters, "Calls per block")->capture_default_str();
  app.add_option("--blocks", o.blocks, "Blocks per algorithm and size")->capture_default_str();
  app.add_option("--json", o.json, "Also write the rows as a JSON array to this file");
  try {
    app.parse(argc, argv);
    mwms::bench::check_flag_at_least("-f/--stepfactor", o.factor, 2);
    mwms::bench::check_flag_at_least("-n/--iters", o.iters, 1);
    mwms::bench::check_flag_at_least("--blocks", o.blocks, 1);
    if (o.algos.empty()) throw mwms::InvalidArgument("--algos: name at least one algorithm");
    if (o.min_bytes < 4 || o.min_bytes > o.max_bytes) {
      throw mwms::InvalidArgument("-b/--minbytes must be at least 4 and at most -e/--maxbytes");
    }
  } catch (const CLI::ParseError& e) {
    const int status = app.exit(e);
    return status == 0 ? 0 : 2;
  } catch (const mwms::Error& e) {
    std::cerr << "algorithm_ab: " << e.what() << "\n";
    return 2;
  }
  return std::nullopt;
}

// Each algorithm's block times per call (microseconds) at `bytes`; false when a sum is wrong.
bool time_size(std::vector<std::unique_ptr<mwms::Communicator>>& comms, std::size_t bytes,
               const Options& o, std::vector<std::vector<double>>* us) {
  const std::size_t count = bytes / 4;
  const int n = comms[0]->world_size();
  std::vector<float> buf(count);
  bool right = true;
  us->assign(comms.size(), std::vector<double>(static_cast<std::size_t>(o.blocks)));
  for (std::size_t a = 0; a < comms.size(); ++a) {  // warm-up and check
    std::fill(buf.begin(), buf.end(), 1.0f);
    comms[a]->all_reduce(buf.data(), count, mwms::DataType::kFloat32, mwms::ReduceOp::kSum);
    for (float v : buf) right = right && v == static_cast<float>(n);
    for (int w = 0; w < 50; ++w) {
      comms[a]->all_reduce(buf.data(), count, mwms::DataType::kFloat32, mwms::ReduceOp::kSum);
    }
  }
  for (int b = 0; b < o.blocks; ++b) {
    for (std::size_t a = 0; a < comms.size(); ++a) {
      comms[a]->barrier();
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < o.iters; ++i) {
        comms[a]->all_reduce(buf.data(), count, mwms::DataType::kFloat32, mwms::ReduceOp::kSum);
      }
      const std::chrono::duration<double, std::micro> took =
          std::chrono::steady_clock::now() - start;
      (*us)[a][static_cast<std::size_t>(b)] = took.count() / o.iters;
    }
  }
  for (auto& t : *us) {  // the slowest rank's time of every block
    comms[0]->all_reduce(t.data(), t.size(), mwms::DataType::kFloat64, mwms::ReduceOp::kMax);
  }
  return right;
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 == 1 ? v[m] : (v[m - 1] + v[m]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (const std::optional<int> stop = parse(argc, argv, o)) return *stop;
  try {
    const mwms::ResolvedCluster cluster = mwms::resolve_from_environment();
    std::vector<std::unique_ptr<mwms::Communicator>> comms;
    for (const std::string& a : o.algos) {
      mwms::CommunicatorOptions co;
      co.algorithm = a;
      comms.push_back(mwms::Communicator::create(cluster, co));
    }
    const bool root = comms[0]->rank() == 0;
    if (root) {
      std::printf("# algorithm_ab: %d ranks, %s; medians of %d blocks of %d calls, us per call\n",
                  comms[0]->world_size(), comms[0]->describe().c_str(), o.blocks, o.iters);
    }
    nlohmann::json rows = nlohmann::json::array();
    bool right = true;
    for (std::size_t bytes = o.min_bytes; bytes <= o.max_bytes;
         bytes *= static_cast<std::size_t>(o.factor)) {
      std::vector<std::vector<double>> us;
      right = time_size(comms, bytes, o, &us) && right;
      if (!root) continue;
      std::printf("%10zu B", bytes);
      const double first = median_of(us[0]);
      for (std::size_t a = 0; a < comms.size(); ++a) {
        const double t = median_of(us[a]);
        std::printf("  %s %.3f (%.2fx)", o.algos[a].c_str(), t, first / t);
        rows.push_back(
            {{"size", bytes}, {"algorithm", o.algos[a]}, {"time_us", t}, {"ratio", first / t}});
      }
      std::printf("\n");
    }
    for (auto& c : comms) c->finalize();
    if (root && !o.json.empty()) {
      std::ofstream f(o.json);
      f << rows.dump(1) << "\n";
      if (!f) {
        std::cerr << "algorithm_ab: cannot write " << o.json << "\n";
        return 2;
      }
    }
    if (!right) std::cerr << "algorithm_ab: a sum was wrong\n";
    return right ? 0 : 1;
  } catch (const mwms::InvalidArgument& e) {
    std::cerr << "algorithm_ab: " << e.what() << "\n";
    return 2;
  } catch (const mwms::Error& e) {
    std::cerr << "algorithm_ab: " << e.what() << "\n";
    return 1;
  }
}
