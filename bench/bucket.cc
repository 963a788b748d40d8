// bucket_perf: issue 6's bucket target, "200 small gradient tensors (25 MiB in all) through the
// strategy's buckets >= 5x faster than 200 separate all-reduces", measured. The tensors are
// shaped like a CNN's (common/gradients.h) and allocated separately, as a model's gradients are,
// so the bucketed path packs them as it would in training. Two paths, timed in the same run on
// the same buffers:
//   host (--backend auto|tcp|shm|mpi, or absent): MultiWorkerMirroredStrategy::
//     all_reduce_gradients (buckets of bytes_per_pack) against one Communicator::all_reduce per
//     tensor on the strategy's own communicator;
//   device (--backend nccl): DeviceCommunicator::all_reduce_bucket_async (one NCCL group) against
//     one DeviceCommunicator::all_reduce_async per tensor, all enqueued, then waited for.
// Each path is checked once (exact, as the *_perf tools check) and timed as the median of -n
// iterations after -w warm-ups, each iteration the whole set of tensors; max over ranks.
#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/device_bench.h"
#include "common/gradients.h"
#include "common/mpi_baseline.h"
#include "common/options.h"
#include "common/output.h"
#include "common/run_environment.h"
#include "common/statistics.h"
#include "common/timing.h"
#include "common/verification.h"
#include "mwms/mwms.h"

namespace mwms::bench {
namespace {

bool launched_by_mpirun() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr;
}

// The backend asked for, for the banner and the JSON: the flag, else MWMS_TRANSPORT, else auto.
std::string requested_backend_name(const BucketOptions& options) {
  if (!options.backend.empty()) return options.backend;
  const char* env = std::getenv("MWMS_TRANSPORT");
  return env != nullptr && *env != '\0' ? std::string(env) : "auto";
}

int launcher_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMI_RANK"}) {
    if (const char* value = std::getenv(name)) return std::atoi(value);
  }
  return 0;
}

// The host path: the strategy's buckets against one all-reduce per tensor.
BucketRow run_host(const std::vector<std::size_t>& counts, const BucketOptions& options,
                   BucketRunInfo* info, bool* leader) {
  // Note [bucket_perf transport]: the strategy takes its transport from MWMS_TRANSPORT (its
  // options have none), so --backend is handed to it there, as a user would set it.
  if (!options.backend.empty() && setenv("MWMS_TRANSPORT", options.backend.c_str(), 1) != 0) {
    throw InvalidArgument("--backend " + options.backend + ": cannot set MWMS_TRANSPORT");
  }
  CommunicationOptions copts;
  if (options.bytes_per_pack > 0) copts.bytes_per_pack = options.bytes_per_pack;  // else MWMS_*
  MultiWorkerMirroredStrategy strategy(resolve_from_environment(), copts);
  Communicator& comm = strategy.communicator();
  try {
    const std::size_t elem = dtype_size(options.dtype);
    const int n = comm.world_size();
    std::vector<std::vector<unsigned char>> storage;  // one allocation per tensor, zeroed
    std::vector<TensorRef> tensors;
    std::vector<std::size_t> tensor_bytes;
    storage.reserve(counts.size());
    for (std::size_t c : counts) {
      storage.emplace_back(c * elem);
      tensors.push_back(TensorRef{storage.back().data(), c, options.dtype});
      tensor_bytes.push_back(c * elem);
    }
    const auto fill = [&](bool pattern) {
      const double constant = options.op == ReduceOp::kProd ? 1.0 : 0.0;
      for (const TensorRef& t : tensors) {
        for (std::size_t i = 0; i < t.count; ++i) {
          store_element(t.data, i, t.dtype,
                        pattern ? reduction_input(i, comm.rank(), n, options.op) : constant);
        }
      }
    };
    const auto wrong = [&] {
      std::int64_t bad = 0;
      for (const TensorRef& t : tensors) {
        for (std::size_t i = 0; i < t.count; ++i) {
          if (load_element(t.data, i, t.dtype) != reduction_expected(i, n, options.op)) ++bad;
        }
      }
      return bad;
    };
    const auto bucketed = [&] { strategy.all_reduce_gradients(tensors, options.op); };
    const auto separate = [&] {
      for (const TensorRef& t : tensors) comm.all_reduce(t.data, t.count, t.dtype, options.op);
    };
    double times[2] = {0, 0};
    std::int64_t bad = 0;
    if (options.check != 0) {
      fill(true);
      bucketed();
      bad += wrong();
      fill(true);
      separate();
      bad += wrong();
    }
    std::vector<double> samples;
    const auto median_us = [&](const auto& once) {
      fill(false);
      for (int i = 0; i < options.warmup_iters; ++i) once();
      comm.barrier();
      time_iterations(options.iters, samples, once);
      return median(samples);
    };
    times[0] = median_us(bucketed);
    times[1] = median_us(separate);
    comm.all_reduce(times, 2, DataType::kFloat64, ReduceOp::kMax);
    comm.all_reduce(&bad, 1, DataType::kInt64, ReduceOp::kSum);
    BucketRow row;
    row.tensors = counts.size();
    row.smallest_bytes = static_cast<std::size_t>(-1);
    for (std::size_t b : tensor_bytes) {
      row.bytes += b;
      row.smallest_bytes = std::min(row.smallest_bytes, b);
      row.largest_bytes = std::max(row.largest_bytes, b);
    }
    row.type = std::string(to_string(options.dtype));
    row.redop = std::string(to_string(options.op));
    row.buckets = count_buckets(tensor_bytes, *strategy.options().bytes_per_pack);
    const double factor = 2.0 * (n - 1) / n;
    row.bucketed_time_us = times[0];
    row.bucketed_busbw = gb_per_s(static_cast<double>(row.bytes), times[0]) * factor;
    row.separate_time_us = times[1];
    row.separate_busbw = gb_per_s(static_cast<double>(row.bytes), times[1]) * factor;
    row.wrong = options.check != 0 ? bad : -1;
    info->buffers = "host";
    info->ranks = n;
    info->backend = requested_backend_name(options);
    info->describe = comm.describe();
    info->bytes_per_pack = *strategy.options().bytes_per_pack;
    info->iters = options.iters;
    info->warmup_iters = options.warmup_iters;
    *leader = comm.rank() == 0;
    strategy.finalize();
    return row;
  } catch (const std::exception& e) {
    comm.abort(e.what());  // peers blocked in a collective fail fast, naming this rank
    throw;
  }
}

int run(int argc, char** argv) {
  const std::string program = "bucket_perf";
  const bool under_mpirun = launched_by_mpirun();
  int status = 0;
  std::optional<BucketOptions> options =
      parse_bucket_options(argc, argv, program, launcher_rank() == 0, &status);
  if (!options) return status;
  const bool on_device = options->backend == "nccl";
  if (on_device && !device::built_with_nccl()) {
    if (launcher_rank() == 0) {
      std::cerr << program << ": --backend nccl: this build has no NCCL (configure with "
                << "-DMWMS_WITH_CUDA=ON where CUDA and NCCL are installed)\n";
    }
    return 2;
  }
  if (on_device) {
    const std::string reason = device::no_device_reason();
    if (!reason.empty()) {
      std::cerr << program + ": --backend nccl needs a CUDA device (one per rank): " + reason + "\n"
                << std::flush;
      return 1;
    }
  }
  try {
    const std::vector<std::size_t> counts =
        model_like_counts(options->tensors, options->total_bytes, dtype_size(options->dtype));
    if (under_mpirun && mpi::built_with_mpi()) mpi::init(options->backend == "mpi");
    BucketRunInfo info;
    // Before run_host hands --backend to the strategy as MWMS_TRANSPORT: what the user set.
    const std::vector<EnvSetting> environment =
        measured_environment(on_device ? EnvScope::kDevice : EnvScope::kHost);
    bool leader = false;
    const BucketRow row = on_device ? device::run_buckets(counts, *options, &info, &leader)
                                    : run_host(counts, *options, &info, &leader);
    if (leader) {
      std::cout << "# bucket_perf: libmwms " << MWMS_VERSION_STRING << "\n"
                << "# " << row.tensors << " gradient tensors shaped like a CNN's (" << row.bytes
                << " B in all), " << info.buffers << " buffers, "
                << (on_device ? "DeviceCommunicator::all_reduce_bucket (one NCCL group)"
                              : "MultiWorkerMirroredStrategy::all_reduce_gradients (buckets of " +
                                    std::to_string(info.bytes_per_pack) + " B)")
                << " against one all-reduce per tensor\n"
                << "# time: median of " << info.iters << " iterations (each the whole set) after "
                << info.warmup_iters << " warm-ups, max over ranks; busbw = algbw * "
                << 2.0 * (info.ranks - 1) / info.ranks << "\n"
                << "# Backend: " << info.backend << " requested; used: " << info.describe << "\n"
                << "# Environment: "
                << describe_environment(environment, on_device ? "" : options->backend) << "\n"
                << "# Ranks: " << info.ranks << "\n#\n";
      print_bucket_table(std::cout, row);
      info.environment = environment;
      if (!options->json_path.empty()) write_bucket_json(options->json_path, row, info);
    }
    mpi::finalize();
    return row.wrong > 0 ? 1 : 0;
  } catch (const std::exception& e) {
    std::string line = program + ": ";
    if (under_mpirun) line += "mpi rank " + std::to_string(launcher_rank()) + ": ";
    std::cerr << line + e.what() + "\n" << std::flush;
    if (mpi::active()) mpi::abort_job(2);
    return 2;
  }
}

}  // namespace
}  // namespace mwms::bench

int main(int argc, char** argv) { return mwms::bench::run(argc, argv); }
