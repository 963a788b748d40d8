// The shared driver of every *_perf tool: bootstrap, one sweep over message sizes, and for each
// size: check (first iteration), warm-up, timed iterations, the same for MPI under --compare mpi
// and for Gloo's two all-reduce algorithms (on libmwms's own buffer) under --compare gloo, their
// iterations interleaved (Note [interleaved comparison]), then one row reduced across ranks. --backend nccl hands the sweep to device_bench.h (device
// buffers, --compare nccl). See bench/README.md for what the columns mean.
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <thread>
#include <vector>

#include "common/collective.h"
#include "common/device_bench.h"
#include "common/gloo_baseline.h"
#include "common/mpi_baseline.h"
#include "common/options.h"
#include "common/output.h"
#include "common/run_environment.h"
#include "common/size_sweep.h"
#include "common/statistics.h"
#include "common/timing.h"
#include "common/verification.h"
#include "mwms/mwms.h"

namespace mwms::bench {
namespace {

// Started by mpirun/mpiexec (Open MPI's OMPI_COMM_WORLD_SIZE, or a PMI launcher's PMI_SIZE): then
// the bench initialises MPI itself, before libmwms bootstraps.
bool launched_by_mpirun() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr;
}

// The launcher's rank (0 without one): decides who prints command-line errors, which happen
// before any communicator exists.
int launcher_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMI_RANK"}) {
    if (const char* value = std::getenv(name)) return std::atoi(value);
  }
  return 0;
}

// Page-aligned and touched once at allocation: a fresh page costs ~11 us on first touch (see
// DESIGN.md), which must not land inside a timed iteration.
class TouchedBuffer {
 public:
  explicit TouchedBuffer(std::size_t bytes) {
    constexpr std::size_t kAlign = 4096;
    std::size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
    if (rounded == 0) rounded = kAlign;
    data_.reset(static_cast<unsigned char*>(std::aligned_alloc(kAlign, rounded)));
    if (!data_) throw BackendError("cannot allocate " + std::to_string(rounded) + " bytes", ENOMEM);
    std::memset(data_.get(), 0, rounded);
  }
  void* data() const { return data_.get(); }

 private:
  struct Free {
    void operator()(unsigned char* p) const { std::free(p); }
  };
  std::unique_ptr<unsigned char, Free> data_;
};

class Sweep {
 public:
  Sweep(const CollectiveDescriptor& collective, const BenchOptions& options, Communicator& comm)
      : collective_(collective), options_(options), comm_(comm),
        elem_bytes_(dtype_size(options.dtype)),
        max_elements_(collective.buffer_count(
            collective.count_for_bytes(options.max_bytes, elem_bytes_, comm.world_size()),
            comm.world_size())),
        buffer_(max_elements_ * elem_bytes_),
        mpi_buffer_(options.compare_mpi ? max_elements_ * elem_bytes_ : 0) {}

  /// Runs every size; returns the exit status (1 when any element was wrong).
  int run() {
    const bool leader = comm_.rank() == 0;
    if (leader) print_banner();
    return sweep_sizes(
        collective_, options_, comm_.world_size(), leader,
        [this](std::size_t count) { return measure(count); }, [this] { return run_info(); });
  }

 private:
  CallShape shape(std::size_t count) const {
    return CallShape{count, comm_.rank(), comm_.world_size(), options_.op, options_.root};
  }
  void run_ours(const CallShape& shape) {
    collective_.run(comm_, buffer_.data(), shape, options_.dtype);
  }
  void run_mpi(const CallShape& shape) {
    collective_.run_mpi(mpi_buffer_.data(), shape, options_.dtype);
  }

  // The first iteration runs on the check pattern and is verified; it also serves as the first
  // warm-up iteration.
  std::int64_t check_first_iteration(const CallShape& shape) {
    fill_input(collective_, buffer_.data(), shape, options_.dtype);
    run_ours(shape);
    return count_wrong(collective_, buffer_.data(), shape, options_.dtype);
  }

  // One contender of a row: libmwms, MPI_Allreduce or a Gloo algorithm, on its buffer; `settle`
  // (may be empty) runs after each of its iterations, outside the timing.
  struct Contender {
    void* buffer;
    int warmups;
    std::function<void()> run;
    std::function<void()> settle;
  };

  // Note [leaving mpi]: Open MPI progresses only inside MPI calls (no progress thread). A rank
  // whose MPI_Allreduce returned may still owe a peer a message (a send queued on the TCP BTL,
  // the last exchange of redscat_allgather), and once it is inside libmwms's next collective it
  // makes no MPI call: the peer waits in MPI_Allreduce for it while it waits in libmwms for the
  // peer, until the timeout (2 of 3 runs of 4 ranks on 2 loaded cores, --backend tcp). So after
  // every MPI iteration, outside the timing, the ranks leave MPI together: a libmwms barrier runs
  // asynchronously while this thread keeps calling MPI_Iprobe, and the next contender starts only
  // when every rank is past its MPI call. It sits at the same point of the counted loop on every
  // rank (never a clock), so every rank runs the same collectives in the same order, and the
  // barrier's deadline bounds it like any libmwms wait.
  void leave_mpi() {
    std::shared_ptr<Work> done = comm_.barrier_async();
    while (!done->test()) {
      mpi::progress();
      std::this_thread::yield();  // more ranks than cores: let the one we wait for run
    }
    done->wait();  // rethrows the barrier's error
  }

  // Note [interleaved comparison]: the machines are shared, so memory bandwidth and CPU time move
  // by tens of percent within a second. Timing each contender's iterations as one block would
  // give each a different slice of that noise, and the ratio would move with it (0.6-1.6x between
  // runs of one cell). So after every contender's warm-up and one barrier, iteration i of every
  // contender runs before iteration i + 1 of any: each contender's median is over the same
  // stretch of time. Returns each contender's median iteration time in microseconds.
  std::vector<double> interleaved_medians(std::size_t elements, std::vector<Contender>& contenders) {
    for (Contender& c : contenders) {
      fill_constant(c.buffer, elements, options_.dtype, collective_.timing_value(options_.op));
      for (int i = 0; i < c.warmups; ++i) {
        c.run();
        if (c.settle) c.settle();
      }
    }
    comm_.barrier();  // start the timed loop together, not skewed by the check above
    times_us_.resize(contenders.size());
    for (auto& t : times_us_) t.assign(static_cast<std::size_t>(options_.iters), 0.0);
    for (int i = 0; i < options_.iters; ++i) {
      for (std::size_t k = 0; k < contenders.size(); ++k) {
        Stopwatch watch;
        contenders[k].run();
        times_us_[k][static_cast<std::size_t>(i)] = watch.elapsed_us();
        if (contenders[k].settle) contenders[k].settle();
      }
    }
    std::vector<double> medians;
    for (auto& t : times_us_) medians.push_back(median(t));
    return medians;
  }

  // One row; size and count describe the whole in-place buffer, as nccl-tests print them.
  ResultRow measure(std::size_t count) {
    const CallShape call = shape(count);
    const std::size_t elements = collective_.buffer_count(count, comm_.world_size());
    ResultRow row = start_row(collective_, options_, elements);
    int warmups = options_.warmup_iters;
    std::int64_t wrong = 0;
    if (options_.check != 0) {
      wrong = check_first_iteration(call);
      if (warmups > 0) --warmups;
    }
    std::vector<Contender> contenders{{buffer_.data(), warmups, [&] { run_ours(call); }, {}}};
    if (options_.compare_mpi) {
      contenders.push_back({mpi_buffer_.data(), options_.warmup_iters, [&] { run_mpi(call); },
                            [this] { leave_mpi(); }});
    }
    if (options_.compare_gloo) {
      // Gloo's algorithms are built for this buffer and count (their scratch allocated here, not
      // in the timing), then timed on libmwms's buffer.
      gloo_baseline::prepare(buffer_.data(), elements, options_.dtype, options_.op);
      using gloo_baseline::Algorithm;
      contenders.push_back({buffer_.data(), options_.warmup_iters,
                            [] { gloo_baseline::run(Algorithm::kRingChunked); }, {}});
      contenders.push_back({buffer_.data(), options_.warmup_iters,
                            [] { gloo_baseline::run(Algorithm::kHalvingDoubling); }, {}});
    }
    const std::vector<double> medians = interleaved_medians(elements, contenders);
    double times[4] = {medians[0], 0.0, 0.0, 0.0};
    std::size_t next = 1;
    if (options_.compare_mpi) times[1] = medians[next++];
    if (options_.compare_gloo) {
      times[2] = medians[next++];
      times[3] = medians[next++];
    }
    // A collective finishes when its slowest rank does: quote the slowest rank's median.
    comm_.all_reduce(times, 4, DataType::kFloat64, ReduceOp::kMax);
    comm_.all_reduce(&wrong, 1, DataType::kInt64, ReduceOp::kSum);
    const double factor = collective_.busbw_factor(comm_.world_size());
    row.time_us = times[0];
    row.algbw = gb_per_s(static_cast<double>(row.bytes), row.time_us);
    row.busbw = row.algbw * factor;
    row.wrong = options_.check != 0 ? wrong : -1;
    if (options_.compare_mpi) {
      row.has_mpi = true;
      row.mpi_time_us = times[1];
      row.mpi_busbw = gb_per_s(static_cast<double>(row.bytes), row.mpi_time_us) * factor;
    }
    if (options_.compare_gloo) {
      row.has_gloo = true;
      row.gloo_ring_time_us = times[2];
      row.gloo_ring_busbw = gb_per_s(static_cast<double>(row.bytes), times[2]) * factor;
      row.gloo_hd_time_us = times[3];
      row.gloo_hd_busbw = gb_per_s(static_cast<double>(row.bytes), times[3]) * factor;
    }
    return row;
  }

  RunInfo run_info() const {
    RunInfo info;
    info.collective = collective_.name;
    info.ranks = comm_.world_size();
    info.backend = requested_backend(options_);
    info.describe = comm_.describe();
    info.iters = options_.iters;
    info.warmup_iters = options_.warmup_iters;
    info.environment = measured_environment(EnvScope::kHost);
    if (options_.compare_mpi) {
      info.mpi_library = mpi::library_version();
      info.malloc_keeps_freed = malloc_not_as_recommended().empty();
    }
    if (options_.compare_gloo) info.gloo_library = gloo_baseline::library_version();
    return info;
  }

  void print_banner() const {
    const ResolvedCluster& cluster = comm_.cluster();
    std::cout << "# " << collective_.name << "_perf: libmwms " << MWMS_VERSION_STRING << "\n"
              << "# minBytes " << options_.min_bytes << " maxBytes " << options_.max_bytes
              << " step: " << options_.step_factor << "(factor) warmup iters: "
              << options_.warmup_iters << " iters: " << options_.iters
              << " validation: " << options_.check << " backend: " << requested_backend(options_)
              << " compare: " << compared();
    if (collective_.uses_root) std::cout << " root: " << options_.root;
    std::cout << "\n"
              << "# time: median iteration time of each rank, max over ranks; algbw = size / time;"
              << " busbw = algbw * " << collective_.busbw_factor(comm_.world_size()) << "\n#\n"
              << "# Backend: " << requested_backend(options_) << " requested; used: "
              << comm_.describe() << "\n"
              << "# Environment: "
              << describe_environment(measured_environment(EnvScope::kHost), options_.backend)
              << "\n";
    if (options_.compare_mpi) print_mpi_banner();
    if (options_.compare_gloo) {
      std::cout
          << "# Gloo: " << gloo_baseline::library_version()
          << ": AllreduceRingChunked (ring time, ring busbw) and AllreduceHalvingDoubling (hd time,"
          << " hd busbw) on"
          << " the same buffer; vs gloo = busbw / the better of the two\n";
    }
    std::cout << "# Ranks: " << comm_.world_size() << " (" << cluster.source_detail << ")\n";
    for (int r = 0; r < comm_.world_size(); ++r) {
      std::cout << "#  Rank " << r << " " << cluster.task_name_of_rank(r);
      if (static_cast<std::size_t>(r) < cluster.ring.size()) std::cout << " " << cluster.ring[r];
      std::cout << "\n";
    }
    std::cout << "#\n";
    print_table_header(std::cout, options_.compare_mpi, options_.compare_gloo, false);
  }

  std::string compared() const {
    if (options_.compare_mpi && options_.compare_gloo) return "mpi,gloo";
    if (options_.compare_mpi) return "mpi";
    return options_.compare_gloo ? "gloo" : "none";
  }

  // Which MPI, and whether it runs at its best: Open MPI's MPI_Allreduce mallocs a message-sized
  // temporary per call, and glibc gives large freed blocks back to the kernel, so without the two
  // variables every call first-touches fresh pages (~11 us per 4 KiB here) inside the timing.
  // The advice is printed only to a run that lacks them (mpirun -x passes them to the ranks, so
  // this process's environment is what the ranks got).
  static void print_mpi_banner() {
    const std::vector<std::string> missing = malloc_not_as_recommended();
    std::cout << "# MPI: " << mpi::library_version() << "\n"
              << "# glibc keeps freed memory in this run: ";
    if (missing.empty()) {
      std::cout << "yes (MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=-1)\n";
      return;
    }
    std::cout << "no (";
    for (std::size_t i = 0; i < missing.size(); ++i) std::cout << (i ? ", " : "") << missing[i];
    std::cout << ")\n"
              << "# MPI at its best: mpirun -x MALLOC_MMAP_MAX_=0 -x MALLOC_TRIM_THRESHOLD_=-1 ..."
              << " (glibc keeps freed memory: MPI_Allreduce mallocs a message-sized temporary per"
              << " call and first-touching fresh pages costs ~11 us per 4 KiB here)\n";
  }

  const CollectiveDescriptor& collective_;
  const BenchOptions& options_;
  Communicator& comm_;
  std::size_t elem_bytes_;
  std::size_t max_elements_;
  TouchedBuffer buffer_;
  TouchedBuffer mpi_buffer_;
  std::vector<std::vector<double>> times_us_;  // by contender, by iteration
};

// Refuses --compare mpi where it cannot mean anything, before anything is started.
void check_compare_mpi(const CollectiveDescriptor& collective, const BenchOptions& options) {
  if (!options.compare_mpi) return;
  if (collective.run_mpi == nullptr) {
    throw InvalidArgument(std::string("--compare mpi: no MPI equivalent of ") + collective.name);
  }
  if (!mpi::built_with_mpi()) throw InvalidArgument("--compare mpi: " + mpi::unsupported_reason(
                                                        options.dtype, options.op));
  if (!launched_by_mpirun()) {
    throw InvalidArgument(
        "--compare mpi needs the bench to be started by mpirun (OMPI_COMM_WORLD_SIZE/PMI_SIZE are "
        "not set); under TF_CONFIG or as a single process only libmwms is timed");
  }
  const std::string reason = mpi::unsupported_reason(options.dtype, options.op);
  if (!reason.empty()) throw InvalidArgument("--compare mpi: " + reason);
}

// Refuses --compare gloo where it cannot mean anything, before anything is started.
void check_compare_gloo(const CollectiveDescriptor& collective, const BenchOptions& options) {
  if (!options.compare_gloo) return;
  if (!collective.gloo_all_reduce) {
    throw InvalidArgument(std::string("--compare gloo: only all_reduce_perf times Gloo (not ") +
                          collective.name + ")");
  }
  const std::string reason = gloo_baseline::unsupported_reason(options.dtype, options.op);
  if (!reason.empty()) throw InvalidArgument("--compare gloo: " + reason);
}

int run_with_communicator(const CollectiveDescriptor& collective, const BenchOptions& options) {
  CommunicatorOptions comm_options;
  comm_options.implementation = Implementation::kAuto;  // what users get by default
  comm_options.transport = transport_choice(options);  // unset without --backend
  std::unique_ptr<Communicator> comm =
      Communicator::create(resolve_from_environment(), comm_options);
  if (options.compare_mpi && mpi::world_size() != comm->world_size()) {
    throw InvalidArgument("--compare mpi: MPI has " + std::to_string(mpi::world_size()) +
                          " ranks but libmwms resolved " + std::to_string(comm->world_size()) +
                          " (TF_CONFIG set under mpirun?)");
  }
  if (collective.uses_root && options.root >= comm->world_size()) {
    // Every rank has the same options, so every rank stops here: no peer is left waiting.
    throw InvalidArgument("--root " + std::to_string(options.root) + " is not a rank (world size " +
                          std::to_string(comm->world_size()) + ")");
  }
  try {
    if (options.compare_gloo) gloo_baseline::connect(*comm, options.gloo_store);
    const int status = Sweep(collective, options, *comm).run();
    gloo_baseline::disconnect();
    return status;
  } catch (const std::exception& e) {
    gloo_baseline::disconnect();
    comm->abort(e.what());  // peers blocked in a collective fail fast, naming this rank
    throw;
  }
}

}  // namespace

std::size_t blocked_count_for_bytes(std::size_t bytes, std::size_t elem_bytes, int world_size) {
  return bytes / elem_bytes / static_cast<std::size_t>(world_size);
}

std::size_t blocked_buffer_count(std::size_t count, int world_size) {
  return count * static_cast<std::size_t>(world_size);
}

double blocked_busbw_factor(int world_size) {
  return static_cast<double>(world_size - 1) / world_size;
}

int run_bench(int argc, char** argv, const CollectiveDescriptor& collective) {
  const std::string program = std::string(collective.name) + "_perf";
  const bool under_mpirun = launched_by_mpirun();
  int status = 0;
  std::optional<BenchOptions> options =
      parse_options(argc, argv, program, launcher_rank() == 0, &status,
                    ToolFlags{collective.uses_root, collective.uses_op});
  if (!options) return status;
  if (device_backend(*options)) {
    // Refused before anything starts, by every rank alike: a build without NCCL is a usage error
    // (2); a machine without a usable GPU is this run's failure (1), said plainly.
    const bool print = launcher_rank() == 0;
    if (!device::built_with_nccl()) {
      if (print) {
        std::cerr << program << ": --backend nccl: this build has no NCCL (libmwms was built "
                  << "without CUDA/NCCL: configure with -DMWMS_WITH_CUDA=ON where CUDA and NCCL "
                  << "are installed); host buffers: --backend auto|tcp|shm|mpi\n";
      }
      return 2;
    }
    const std::string reason = device::no_device_reason();
    if (!reason.empty()) {
      std::cerr << program + ": " +
                       (under_mpirun ? "mpi rank " + std::to_string(launcher_rank()) + ": " : "") +
                       "--backend nccl needs a CUDA device (one per rank) and this machine has "
                       "none usable: " +
                       reason + "\n"
                << std::flush;
      return 1;
    }
  }
  try {
    check_compare_mpi(collective, *options);
    check_compare_gloo(collective, *options);
    // MPI first, so that libmwms finds it initialised and bootstraps through it.
    if (under_mpirun && mpi::built_with_mpi()) mpi::init(requested_backend(*options) == "mpi");
    status = device_backend(*options) ? device::run_sweep(collective, *options)
                                      : run_with_communicator(collective, *options);
  } catch (const std::exception& e) {
    // One write, so that lines from several ranks do not interleave.
    std::string line = program + ": ";
    if (under_mpirun) line += "mpi rank " + std::to_string(launcher_rank()) + ": ";
    std::cerr << line + e.what() + "\n" << std::flush;
    // Under mpirun a rank that stops early would leave the others in MPI_Finalize forever.
    if (mpi::active()) mpi::abort_job(2);
    return 2;
  }
  mpi::finalize();
  return status;
}

}  // namespace mwms::bench
