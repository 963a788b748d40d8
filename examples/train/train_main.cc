// train: data-parallel training of an MLP or the tutorial CNN on Fashion-MNIST through libmwms's
// MultiWorkerMirroredStrategy, with K local replicas (threads) per worker. Runs as one process,
// under mpirun, with TF_CONFIG, or with TF1-style --job_name/--task_index/--cluster_spec flags.
// See examples/README.md.

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <Eigen/Core>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>

#include "mwms/config.h"
#include "mwms/mwms.h"

#include "checkpoint.h"
#include "gpu_model.h"
#include "idx_reader.h"
#include "metrics.h"
#include "mirrored_session.h"
#include "ps_trainer.h"
#include "trainer.h"

namespace {

using mwms::train::EpochStats;
using mwms::train::RunSummary;
using mwms::train::TrainConfig;

struct Flags {
  TrainConfig train;
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  std::string metrics_file;
  std::string job_name;
  int task_index = 0;
  std::string cluster_spec_file;
  std::size_t bytes_per_pack = 0;
  double timeout_seconds = 0;
  std::string compression = "none";
  int local_replicas = 1;
  std::string device = "auto";
  std::string device_why;  // why --device auto chose what it chose (printed in the banner)
  // Parameter-server mode (a "ps" job in the cluster).
  bool sync_replicas = false;
  int replicas_to_aggregate = 0;
  int max_staleness = -1;
  std::string optimizer = "momentum";
  std::string ps_placement = "round_robin";
  int ps_partitions = 0;
  // The session (mwms/session.h), both modes.
  long long save_checkpoint_steps = 0;
  double save_checkpoint_secs = 0;
  int max_recoveries = 0;
  long long log_step_count_steps = 0;
  long long max_steps = 0;
};

/// Exit code of a bad command line (flags, values, combinations), as every other libmwms tool
/// (mwmsrun, the benches, mwms-doctor) and getopt-style programs: 2. A run that fails is 1.
constexpr int kUsageError = 2;

/// Parses the command line. Returns -1 to go on, otherwise the exit code (help: 0, a bad command
/// line: kUsageError, --device gpu without a usable GPU: 1).
int parse_flags(int argc, char** argv, Flags& f) {
  CLI::App app{"Data-parallel MLP or CNN training on Fashion-MNIST with libmwms "
               "(MultiWorkerMirroredStrategy, or parameter servers when the cluster has a ps "
               "job)"};
  // Every option shows its default in --help (capture_default_str); those whose default is
  // "unset" say so in their description instead, as CLI11 prints no empty default.
  app.add_option("--epochs", f.train.epochs, "Epochs to train (total, counting resumed ones)")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  app.add_option("--batch_size", f.train.global_batch_size,
                 "GLOBAL batch size, split across workers")
      ->check(CLI::Range(1, 1 << 30))
      ->capture_default_str();
  app.add_option("--lr", f.train.learning_rate, "Learning rate of the optimizer (--optimizer)")
      ->capture_default_str();
  app.add_option("--seed", f.train.seed, "Seed of the initial weights and of every shuffle")
      ->capture_default_str();
  app.add_option("--data_dir", f.data_dir, "Directory with the Fashion-MNIST IDX files (.gz)")
      ->capture_default_str();
  app.add_option("--checkpoint_dir", f.train.checkpoint_dir,
                 "The chief checkpoints here: all-reduce mode <dir>/ckpt.bin every epoch, ps "
                 "mode <dir>/model.ckpt-<step>.* (default: none, no checkpoints)");
  app.add_flag("--resume", f.train.resume,
               "Continue from the newest checkpoint in --checkpoint_dir if present; ps mode "
               "refuses a directory with checkpoints without it (default: off)");
  app.add_option("--metrics_file", f.metrics_file,
                 "Leader writes JSON metrics here (default: none, no file)");
  app.add_option("--max_steps_per_epoch", f.train.max_steps_per_epoch,
                 "Cap on global batches per epoch (0: all; for smoke tests)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--job_name", f.job_name,
                 "TF1-style job of this task (chief, worker, ps, evaluator; default: none, "
                 "TF_CONFIG or mpirun or one process)");
  app.add_option("--task_index", f.task_index, "TF1-style index of this task in its job")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--cluster_spec", f.cluster_spec_file,
                 "TF1-style cluster spec JSON file ({\"worker\": [\"host:port\", ...]}; "
                 "default: none)");
  app.add_option("--bytes_per_pack", f.bytes_per_pack,
                 "Gradient bucket size in bytes (0: library default)")
      ->capture_default_str();
  app.add_option("--overlap_blocks", f.train.overlap_blocks,
                 "Overlap the gradient all-reduce with backprop, dense_1's kernel gradient in "
                 "this many blocks (0: all-reduce after backprop); with 0 --bytes_per_pack, "
                 "buckets of 128 KiB")
      ->check(CLI::Range(0, 784))
      ->capture_default_str();
  app.add_option("--compression", f.compression,
                 "Gradients on the wire: none, fp16 or bf16 (Horovod's Compression.fp16)")
      ->check(CLI::IsMember({"none", "fp16", "bf16"}))
      ->capture_default_str();
  app.add_option("--model", f.train.model,
                 "mlp (784-256-10) or cnn (TF's MWMS tutorial: conv 32 3x3, max-pool 2, dense 64, "
                 "dense 10)")
      ->check(CLI::IsMember({"mlp", "cnn"}))
      ->capture_default_str();
  app.add_option("--local_replicas", f.local_replicas,
                 "Local replicas per worker (one thread each; num_replicas_in_sync = workers x "
                 "this); every worker must use the same")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--device", f.device,
                 "Where the replicas run: cpu, gpu (cuDNN/cuBLAS, one GPU per process), or auto "
                 "(gpu when this train has its GPU models, a GPU is present and the run needs "
                 "neither --local_replicas > 1, --overlap_blocks nor --compression; else cpu)")
      ->check(CLI::IsMember({"auto", "cpu", "gpu"}))
      ->capture_default_str();
  app.add_option("--timeout_seconds", f.timeout_seconds,
                 "Deadline of every collective or ps request (<= 0: MWMS_TIMEOUT_SECONDS)")
      ->capture_default_str();
  app.add_flag("--sync_replicas", f.sync_replicas,
               "Parameter-server mode: synchronous updates (SyncReplicasOptimizer); default: "
               "asynchronous");
  app.add_option("--replicas_to_aggregate", f.replicas_to_aggregate,
                 "Synchronous ps mode: gradients averaged per step (0: every worker; fewer: "
                 "the others are backup workers)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--max_staleness", f.max_staleness,
                 "Asynchronous ps mode: a worker this many pushes ahead of the slowest waits "
                 "(-1: no bound)")
      ->check(CLI::Range(-1, 1 << 30))
      ->capture_default_str();
  app.add_option("--optimizer", f.optimizer,
                 "sgd, momentum (0.9) or adam; the all-reduce mode runs momentum only")
      ->check(CLI::IsMember({"sgd", "momentum", "adam"}))
      ->capture_default_str();
  app.add_option("--ps_placement", f.ps_placement,
                 "Parameter-server mode: round_robin (replica_device_setter) or greedy (by bytes)")
      ->check(CLI::IsMember({"round_robin", "greedy"}))
      ->capture_default_str();
  app.add_option("--ps_partitions", f.ps_partitions,
                 "Parameter-server mode: split every variable into this many shards along axis 0 "
                 "(fixed_size_partitioner; 0: none)")
      ->check(CLI::Range(0, 1 << 16))
      ->capture_default_str();
  app.add_option("--save_checkpoint_steps", f.save_checkpoint_steps,
                 "The chief checkpoints every this many global steps (0 with "
                 "--save_checkpoint_secs 0: every epoch); the all-reduce mode saves at epoch "
                 "ends only, so a multiple of the steps per epoch")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--save_checkpoint_secs", f.save_checkpoint_secs,
                 "Parameter-server mode: the chief checkpoints every this many seconds (not with "
                 "--save_checkpoint_steps; 0: by steps)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--max_recoveries", f.max_recoveries,
                 "Parameter-server mode: when a ps or peer fails, reconnect the job and restore "
                 "the newest checkpoint up to this many times (every task must use the same)")
      ->check(CLI::Range(0, 1000))
      ->capture_default_str();
  app.add_option("--log_step_count_steps", f.log_step_count_steps,
                 "The chief prints the global step, its loss and global steps/s every this many "
                 "of its own steps (0: per epoch only)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--max_steps", f.max_steps,
                 "Stop at this global step (StopAtStepHook), whatever --epochs says (0: after "
                 "--epochs epochs)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "train: error: " << e.what() << "\nRun with --help for usage." << std::endl;
    return kUsageError;
  }
  if (!(f.train.learning_rate > 0)) {
    std::cerr << "train: error: --lr must be positive" << std::endl;
    return kUsageError;
  }
  if (f.job_name.empty() != f.cluster_spec_file.empty() ||
      (app.count("--task_index") > 0 && f.job_name.empty())) {
    std::cerr << "train: error: --job_name, --task_index and --cluster_spec go together"
              << std::endl;
    return kUsageError;
  }
  if (f.train.overlap_blocks > 1 && f.train.model == "cnn") {
    std::cerr << "train: error: --overlap_blocks above 1 splits the MLP's dense_1; with --model "
                 "cnn use 0 or 1" << std::endl;
    return kUsageError;
  }
  // Note [device choice]: --device gpu needs this train's GPU models (CUDA and cuDNN at build
  // time) and a device, and runs one replica per process (Note [gpu replica] in trainer.h): it
  // fails naming what is missing rather than falling back to the CPU. auto is the GPU when one is
  // present and the run is one the GPU path supports (one local replica, no overlap, no
  // compression), else the CPU, so runs asking for the CPU-only features keep working on a GPU
  // machine. Every worker decides alone: a job needs the same flags and hardware everywhere.
  const bool gpu_supported_run =
      f.local_replicas == 1 && f.train.overlap_blocks == 0 && f.compression == "none";
  if (f.device == "gpu" || f.device == "auto") {
    const mwms::train::GpuAvailability gpu = mwms::train::gpu_availability();
    const bool usable = gpu.built && gpu.devices > 0;
    if (f.device == "gpu" && !usable) {
      std::cerr << "train: error: --device gpu: " << gpu.reason << "; use --device cpu"
                << std::endl;
      return 1;
    }
    if (f.device == "gpu" && !gpu_supported_run) {
      std::cerr << "train: error: --device gpu runs one replica per process without overlap or "
                   "compression (--local_replicas 1, --overlap_blocks 0, --compression none): "
                   "launch one process per GPU (mwmsrun, mpirun, TF_CONFIG)" << std::endl;
      return kUsageError;
    }
    if (f.device == "auto") {
      f.device = usable && gpu_supported_run ? "gpu" : "cpu";
      f.device_why = usable ? (gpu_supported_run ? "auto: a GPU is present"
                                                 : "auto: the GPU path runs one replica per "
                                                   "process, without overlap or compression")
                            : "auto: " + gpu.reason;
    }
  }
  f.train.device = f.device;
  // The CNN's activations are ~60x the MLP's per image: evaluate in smaller chunks.
  if (f.train.model == "cnn") f.train.eval_chunk = 200;
  if (f.save_checkpoint_steps > 0 && f.save_checkpoint_secs > 0) {
    std::cerr << "train: error: give --save_checkpoint_steps or --save_checkpoint_secs, not both"
              << std::endl;
    return kUsageError;
  }
  if ((f.save_checkpoint_steps > 0 || f.save_checkpoint_secs > 0) &&
      f.train.checkpoint_dir.empty()) {
    std::cerr << "train: error: --save_checkpoint_steps/--save_checkpoint_secs need "
                 "--checkpoint_dir" << std::endl;
    return kUsageError;
  }
  if (f.train.resume && f.train.checkpoint_dir.empty()) {
    std::cerr << "train: error: --resume needs --checkpoint_dir" << std::endl;
    return kUsageError;
  }
  return -1;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read --cluster_spec file " + path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

mwms::ResolvedCluster resolve_cluster(const Flags& f) {
  if (f.job_name.empty()) return mwms::resolve_from_environment();  // TF_CONFIG, mpirun, alone
  return mwms::resolve_flags(f.job_name, f.task_index, read_file(f.cluster_spec_file));
}

// An evaluator is its own world of one and never joins the training ring (TF's rule): like TF's
// sidecar evaluator it evaluates the chief's latest checkpoint and exits.
Flags evaluator_flags(const Flags& f, const mwms::ResolvedCluster& cluster) {
  if (f.train.checkpoint_dir.empty() ||
      !std::ifstream(mwms::train::checkpoint_path(f.train.checkpoint_dir)).good()) {
    throw std::runtime_error(cluster.task_name() +
                             " is outside the training ring and only evaluates the chief's "
                             "checkpoints: pass the chief's --checkpoint_dir (no checkpoint found" +
                             (f.train.checkpoint_dir.empty() ? std::string(")")
                                                             : " in " + f.train.checkpoint_dir + ")"));
  }
  std::printf("train: %s is outside the training ring; evaluating the checkpoint in %s\n",
              cluster.task_name().c_str(), f.train.checkpoint_dir.c_str());
  Flags e = f;
  e.train.resume = true;
  e.train.epochs = 0;
  return e;
}

std::unique_ptr<mwms::MultiWorkerMirroredStrategy> make_strategy(
    const Flags& f, const mwms::ResolvedCluster& cluster) {
  mwms::CommunicationOptions options;
  // --bytes_per_pack 0 and --timeout_seconds 0 leave the option unset (MWMS_* decides).
  if (f.bytes_per_pack > 0) options.bytes_per_pack = f.bytes_per_pack;
  // Overlap needs buckets smaller than the 0.8 MB gradient to have something to overlap.
  if (f.train.overlap_blocks > 0 && !options.bytes_per_pack) options.bytes_per_pack = 128 << 10;
  if (f.timeout_seconds > 0) options.timeout_seconds = f.timeout_seconds;
  options.compression = f.compression == "fp16"   ? mwms::Compression::kFloat16
                        : f.compression == "bf16" ? mwms::Compression::kBFloat16
                                                  : mwms::Compression::kNone;
  mwms::ReplicaOptions replicas;
  replicas.local_replicas = f.local_replicas;
  return std::make_unique<mwms::MultiWorkerMirroredStrategy>(cluster, options, replicas);
}

// A one-line progress bar on a terminal (step, this worker's loss, images/s), redrawn at most
// 5 times a second; nothing when stdout is not a terminal (logs get the per-epoch lines only).
class ProgressBar {
 public:
  ProgressBar(int epoch, int epochs, std::size_t global_batch)
      : epoch_(epoch), epochs_(epochs), batch_(global_batch) {}
  void operator()(int step, int steps, double loss, double seconds) {
    if (step < steps && seconds - last_ < 0.2) return;
    last_ = seconds;
    const int width = 30;
    const int filled = steps > 0 ? width * step / steps : width;
    const double rate = seconds > 0 ? static_cast<double>(step) * batch_ / seconds : 0;
    std::printf("\r\033[Kepoch %d/%d [%s%s] %d/%d  loss %.4f  %.0f images/s", epoch_, epochs_,
                std::string(static_cast<std::size_t>(filled), '=').c_str(),
                std::string(static_cast<std::size_t>(width - filled), ' ').c_str(), step, steps,
                loss, rate);
    if (step == steps) std::printf("\r\033[K");  // the epoch line replaces the bar
    std::fflush(stdout);
  }

 private:
  int epoch_, epochs_;
  std::size_t batch_;
  double last_ = -1;
};

void print_epoch(const EpochStats& e, int epochs) {
  std::printf("epoch %d/%d: loss %.4f, test accuracy %.4f, %.0f images/s, all-reduce %.1f%% of "
              "%.2f s (%.3f s exposed of %.3f s)\n",
              e.epoch, epochs, e.train_loss, e.test_accuracy, e.images_per_sec,
              100.0 * e.allreduce_share, e.seconds, e.exposed_allreduce_seconds,
              e.allreduce_seconds);
  std::fflush(stdout);
}

mwms::ParameterServerOptions ps_options(const Flags& f) {
  mwms::ParameterServerOptions options;
  options.sync_replicas = f.sync_replicas;
  options.replicas_to_aggregate = f.replicas_to_aggregate;
  options.max_staleness = f.max_staleness;
  if (f.timeout_seconds > 0) options.timeout_seconds = f.timeout_seconds;
  options.optimizer.kind = mwms::parse_optimizer(f.optimizer);
  options.optimizer.learning_rate = f.train.learning_rate;
  options.optimizer.momentum = f.train.momentum;
  options.placement = mwms::parse_ps_placement(f.ps_placement);
  if (f.ps_partitions > 0) options.partitioner = mwms::Partitioner::fixed_size(f.ps_partitions);
  return options;
}

RunSummary ps_run_summary(const Flags& f, const mwms::ResolvedCluster& cluster) {
  RunSummary summary;
  summary.mode = f.sync_replicas ? "ps-sync" : "ps-async";
  summary.num_ps = cluster.num_ps;
  summary.world_size = cluster.num_workers;
  summary.model = f.train.model;
  summary.source = mwms::source_name(cluster.source);
  summary.task = cluster.task_name();
  summary.global_batch_size = f.train.global_batch_size;
  summary.learning_rate = f.train.learning_rate;
  summary.seed = f.train.seed;
  return summary;
}

// A ps task serves until the chief ends the job (TF's server.join()), through every recovery.
int serve_ps(const Flags& f, const mwms::ResolvedCluster& cluster,
             mwms::ParameterServerSessionCreator& creator) {
  std::printf("train: %s is a parameter server; serving %d worker(s) until the chief ends the "
              "job\n", cluster.task_name().c_str(), cluster.num_workers);
  std::fflush(stdout);
  const mwms::ParameterServerStats s = creator.join(f.max_recoveries);
  std::printf(
      "train: %s done: %lld gradient(s) received, %lld applied, %lld dropped as stale, "
      "%lld after the chief ended the job, global step %lld%s\n",
      cluster.task_name().c_str(), static_cast<long long>(s.pushes),
      static_cast<long long>(s.applied), static_cast<long long>(s.dropped_stale),
      static_cast<long long>(s.after_end), static_cast<long long>(s.global_step),
      s.lost_workers.empty() ? "" : ", lost workers:");
  for (const std::string& w : s.lost_workers) std::printf("train:   lost %s\n", w.c_str());
  if (!f.metrics_file.empty()) {
    RunSummary summary = ps_run_summary(f, cluster);
    summary.ps_task = true;  // what it served: no training fields
    summary.global_step = s.global_step;
    summary.pushes = s.pushes;
    summary.applied = s.applied;
    summary.after_end = s.after_end;
    summary.dropped_stale = s.dropped_stale;
    summary.bytes_pushed.assign(s.bytes_pushed.begin(), s.bytes_pushed.end());
    summary.bytes_pulled.assign(s.bytes_pulled.begin(), s.bytes_pulled.end());
    summary.staleness_histogram.assign(s.staleness_histogram.begin(), s.staleness_histogram.end());
    summary.lost_workers = s.lost_workers;
    mwms::train::write_metrics(
        f.metrics_file + ".ps" + std::to_string(cluster.task.index) + ".json", summary);
  }
  return 0;
}

// The session's hooks and checkpoint settings, as both modes use them.
mwms::MonitoredTrainingSessionOptions session_options(const Flags& f, std::int64_t last_step,
                                                      std::int64_t steps_per_save) {
  mwms::MonitoredTrainingSessionOptions o;
  o.checkpoint_dir = f.train.checkpoint_dir;
  o.save_checkpoint_steps = f.save_checkpoint_steps;
  o.save_checkpoint_secs = f.save_checkpoint_secs;
  if (o.save_checkpoint_steps == 0 && o.save_checkpoint_secs == 0) {
    o.save_checkpoint_steps = std::max<std::int64_t>(steps_per_save, 1);
  }
  o.max_recoveries = f.max_recoveries;
  o.log_step_count_steps = f.log_step_count_steps;
  o.hooks = {std::make_shared<mwms::StopAtStepHook>(0, std::max<std::int64_t>(last_step, 1)),
             std::make_shared<mwms::NanTensorHook>()};
  return o;
}

// Parameter-server mode (docs/parameter_server.md): the cluster has a "ps" job. A ps task serves;
// workers train through PsTrainer under a MonitoredTrainingSession, whose chief checkpoints every
// shard and which reconnects and restores after a failure (--max_recoveries).
int run_ps(const Flags& f, const mwms::ResolvedCluster& cluster) {
  const mwms::ParameterServerOptions options = ps_options(f);
  if (cluster.task.type == "ps") {
    mwms::ParameterServerSessionCreator creator(cluster, options, {});
    return serve_ps(f, cluster, creator);
  }
  const mwms::train::Dataset train_set = mwms::train::load_split(f.data_dir, "train", 10);
  const mwms::train::Dataset test_set = mwms::train::load_split(f.data_dir, "t10k", 10);
  const bool leader = cluster.is_chief;
  mwms::train::PsTrainer trainer(f.train, cluster.num_workers, cluster.task_id, f.sync_replicas,
                                 leader, train_set, test_set);
  if (leader && f.max_recoveries > 0 && f.train.checkpoint_dir.empty()) {
    std::fprintf(stderr, "train: warning: --max_recoveries without --checkpoint_dir: a recovery "
                         "starts again from the initial weights\n");
  }
  // The chief refuses a directory with an earlier run's checkpoints once connected (the other
  // tasks then fail at once naming it, rather than wait for it at the rendezvous).
  bool first_session = true;
  mwms::ParameterServerSessionCreator creator(
      cluster, options, [&](mwms::ParameterServerStrategy& s) {
        if (leader && first_session && !f.train.checkpoint_dir.empty() && !f.train.resume &&
            !mwms::latest_checkpoint(f.train.checkpoint_dir).empty()) {
          throw std::runtime_error("--checkpoint_dir " + f.train.checkpoint_dir +
                                   " holds checkpoints of an earlier run: pass --resume to "
                                   "continue from them, or give an empty directory");
        }
        first_session = false;
        trainer.declare(s);
      });
  const std::int64_t per_epoch = trainer.last_step(1);
  const std::int64_t last_step =
      f.max_steps > 0 ? f.max_steps : trainer.last_step(f.train.epochs);
  if (leader) {
    std::printf("train: %s, model %s, parameter servers: %d ps, %d worker(s), %s%s, optimizer "
                "%s, global batch %d, %d step(s)/epoch, lr %g, last step %lld\n",
                cluster.task_name().c_str(), f.train.model.c_str(), cluster.num_ps,
                cluster.num_workers, f.sync_replicas ? "synchronous" : "asynchronous",
                f.sync_replicas && f.replicas_to_aggregate > 0
                    ? (" (replicas_to_aggregate " + std::to_string(f.replicas_to_aggregate) + ")")
                          .c_str()
                    : "",
                f.optimizer.c_str(), f.train.global_batch_size, trainer.steps_per_epoch(),
                f.train.learning_rate, static_cast<long long>(last_step));
    std::fflush(stdout);
  }
  mwms::MonitoredTrainingSession session(creator, session_options(f, last_step, per_epoch));
  if (leader && !creator.strategy().restored_from().empty()) {
    std::printf("train: restored %s (global step %lld)\n",
                creator.strategy().restored_from().c_str(),
                static_cast<long long>(session.global_step()));
  }
  RunSummary summary = ps_run_summary(f, cluster);
  trainer.start_at(session.global_step());
  const auto finish_epoch = [&] {
    EpochStats stats = trainer.end_epoch();
    if (leader) stats.test_accuracy = trainer.evaluate(creator.strategy());
    summary.per_epoch.push_back(stats);
    if (!leader) return;
    std::printf("epoch %d: loss %.4f, test accuracy %.4f, %.0f images/s (%d step(s), global "
                "step %lld)\n",
                stats.epoch, stats.train_loss, stats.test_accuracy, stats.images_per_sec,
                stats.steps, static_cast<long long>(session.global_step()));
    std::fflush(stdout);
  };
  // Every worker trains its own --epochs of its input (Note [ps input position]); the
  // StopAtStepHook ends the run earlier at --max_steps. In asynchronous mode the global step
  // counts every worker's pushes, so it is no bound on one worker's share of the epochs.
  // Built once: a std::function holding this lambda per step would allocate every step.
  const std::function<double(std::int64_t)> ps_step = [&](std::int64_t) {
    return trainer.step(creator.strategy());
  };
  while (session.global_step() < last_step &&
         (f.max_steps > 0 || trainer.epoch() < f.train.epochs) && !session.should_stop()) {
    const mwms::SessionRunValues v =
        session.run(ps_step);
    if (v.recovered) {
      std::printf("train: %s recovered (%d of %d): continuing from global step %lld\n",
                  cluster.task_name().c_str(), session.recoveries(), f.max_recoveries,
                  static_cast<long long>(v.global_step));
      std::fflush(stdout);
      trainer.start_at(v.global_step);
      continue;
    }
    if (trainer.epoch_done()) finish_epoch();
  }
  if (trainer.epoch_steps() > 0) finish_epoch();  // stopped inside an epoch
  summary.epochs = f.train.epochs;
  if (!summary.per_epoch.empty()) {
    summary.test_accuracy = leader ? summary.per_epoch.back().test_accuracy : 0;
    summary.final_train_loss = summary.per_epoch.back().train_loss;
  }
  const mwms::train::PsSummary ps = mwms::train::ps_summary(creator.strategy());
  summary.global_step = ps.global_step;
  summary.pushes = ps.pushes;
  summary.dropped_stale = ps.dropped_stale;
  summary.recoveries = session.recoveries();
  summary.bytes_pushed.assign(ps.bytes_pushed.begin(), ps.bytes_pushed.end());
  summary.bytes_pulled.assign(ps.bytes_pulled.begin(), ps.bytes_pulled.end());
  // Why the loop ended, read before close() (whose goodbye would end the job on the chief).
  const char* why = creator.job_ended()                  ? "the chief ended the job"
                    : session.global_step() >= last_step ? "the last step"
                    : session.should_stop()              ? "a hook stopped it"
                                                         : "its epochs are done";
  session.close();  // the chief's last checkpoint; goodbye to every ps (the chief's ends the job)
  if (!leader) {    // the chief reports the job; every other worker says why it stopped
    std::printf(
        "train: %s stopped at global step %lld (%s): %lld gradient(s) pushed, %lld "
        "dropped as stale\n",
        cluster.task_name().c_str(), static_cast<long long>(ps.global_step), why,
        static_cast<long long>(ps.pushes), static_cast<long long>(ps.dropped_stale));
    std::fflush(stdout);
  }
  if (leader && !f.metrics_file.empty()) mwms::train::write_metrics(f.metrics_file, summary);
  return 0;
}

int run(const Flags& flags) {
  // Workers share the cores; Eigen's own threads would only compete with the other processes.
  Eigen::setNbThreads(1);
  mwms::ResolvedCluster cluster = resolve_cluster(flags);
  if (cluster.num_ps > 0 && cluster.task.type != "evaluator") return run_ps(flags, cluster);
  if (flags.optimizer != "momentum") {
    throw std::runtime_error("--optimizer " + flags.optimizer + ": the all-reduce mode trains "
                             "with momentum only (the parameter-server mode runs sgd, momentum "
                             "and adam)");
  }
  const Flags f = cluster.in_ring ? flags : evaluator_flags(flags, cluster);
  if (!cluster.in_ring) cluster = mwms::ResolvedCluster{};  // leader of its own world of one
  // Note [gpu replica]: the device communicator's rendezvous runs first and is over (its listener
  // closed) before the strategy's begins on the same addresses.
  std::unique_ptr<mwms::DeviceCommunicator> device_comm;
  if (f.device == "gpu") {
    mwms::CommunicatorOptions options;
    if (f.timeout_seconds > 0) options.timeout_seconds = f.timeout_seconds;
    device_comm = mwms::DeviceCommunicator::create(cluster, options);
  }
  auto strategy = make_strategy(f, cluster);
  const mwms::train::Dataset train_set = mwms::train::load_split(f.data_dir, "train", 10);
  const mwms::train::Dataset test_set = mwms::train::load_split(f.data_dir, "t10k", 10);
  mwms::train::Trainer trainer(f.train, *strategy, train_set, test_set, device_comm.get());
  const bool leader = strategy->is_chief();
  if (leader) {
    if (device_comm) {
      std::printf("train: device gradients through %s\n", device_comm->describe().c_str());
    }
    const std::string on = f.device_why.empty() ? f.device : f.device + " (" + f.device_why + ")";
    std::printf("train: %s, model %s on %s, %d replica(s) in sync (%d worker(s) x %d local), "
                "global batch %d, %d step(s)/epoch, lr %g\n",
                strategy->cluster().task_name().c_str(), f.train.model.c_str(), on.c_str(),
                strategy->num_replicas_in_sync(), strategy->num_workers(),
                strategy->num_local_replicas(), f.train.global_batch_size,
                trainer.steps_per_epoch(), f.train.learning_rate);
    std::fflush(stdout);
  }
  if (f.max_recoveries > 0 || f.save_checkpoint_secs > 0) {
    throw std::runtime_error(std::string(f.max_recoveries > 0 ? "--max_recoveries"
                                                              : "--save_checkpoint_secs") +
                             " is for the parameter-server mode (an all-reduce job that loses a "
                             "worker is restarted with --resume; it checkpoints at epoch ends)");
  }
  const int spe = trainer.steps_per_epoch();
  if (f.save_checkpoint_steps > 0 && (spe == 0 || f.save_checkpoint_steps % spe != 0)) {
    throw std::runtime_error("--save_checkpoint_steps " + std::to_string(f.save_checkpoint_steps) +
                             ": the all-reduce mode checkpoints at epoch ends, so a multiple of "
                             "the " + std::to_string(spe) + " steps per epoch");
  }
  // Note [session in all-reduce mode]: every decision here follows the global step, the same on
  // every worker: StopAtStepHook, the epoch ends (evaluation is collective), the chief's saves.
  mwms::train::MirroredSessionCreator creator(*strategy, trainer);
  const std::int64_t last_step = f.max_steps > 0
                                     ? f.max_steps
                                     : static_cast<std::int64_t>(f.train.epochs) * spe;
  mwms::MonitoredTrainingSession session(creator, session_options(f, last_step, spe));
  const int first_epoch = creator.first_epoch();

  RunSummary summary;
  summary.num_replicas_in_sync = strategy->num_replicas_in_sync();
  summary.world_size = strategy->num_workers();
  summary.local_replicas = strategy->num_local_replicas();
  summary.model = f.train.model;
  summary.device = f.device;
  summary.source = mwms::source_name(strategy->cluster().source);
  summary.task = strategy->cluster().task_name();
  summary.global_batch_size = f.train.global_batch_size;
  summary.learning_rate = f.train.learning_rate;
  summary.seed = f.train.seed;
  summary.epochs = std::max(first_epoch, f.train.epochs);
  // mpirun hands every rank a pseudo-terminal whatever its own output is (a file, a pipe), so
  // under an MPI launcher the bar would fill redirected logs with redraws: off there.
  const bool under_mpi = std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr ||
                         std::getenv("PMI_SIZE") != nullptr || std::getenv("PMIX_RANK") != nullptr;
  const bool bar = leader && ::isatty(STDOUT_FILENO) && !under_mpi;
  int epoch = first_epoch;
  bool in_epoch = false;
  const auto finish_epoch = [&] {
    in_epoch = false;
    EpochStats stats = trainer.end_epoch();
    stats.test_accuracy = trainer.evaluate();
    summary.per_epoch.push_back(stats);
    summary.allreduce_seconds += stats.allreduce_seconds;
    summary.exposed_allreduce_seconds += stats.exposed_allreduce_seconds;
    if (leader) print_epoch(stats, f.train.epochs);
  };
  // Built once (no allocation per step).
  const std::function<double(std::int64_t)> step = [&](std::int64_t) {
    const double loss = trainer.train_step();
    creator.advance();
    if (trainer.epoch_steps() == spe) {
      finish_epoch();
      ++epoch;
    }
    return loss;
  };
  while (spe > 0 && session.global_step() < last_step && !session.should_stop()) {
    if (!in_epoch) {
      if (bar) {
        trainer.set_progress(ProgressBar(epoch + 1, f.train.epochs,
                                         static_cast<std::size_t>(f.train.global_batch_size)));
      }
      trainer.begin_epoch(epoch);
      in_epoch = true;
    }
    // The epoch's end is evaluated before the hooks' after_run, so the chief's checkpoint of an
    // epoch end follows its evaluation, as before the session.
    session.run(step);
  }
  if (in_epoch && trainer.epoch_steps() > 0) finish_epoch();  // --max_steps inside an epoch
  if (summary.per_epoch.empty()) {
    // Resumed past the last epoch: report the restored model.
    summary.test_accuracy = trainer.evaluate();
    if (leader) {
      std::printf("train: no epoch left to train (%d completed, --epochs %d), test accuracy %.4f\n",
                  first_epoch, f.train.epochs, summary.test_accuracy);
    }
  } else {
    summary.test_accuracy = summary.per_epoch.back().test_accuracy;
    summary.final_train_loss = summary.per_epoch.back().train_loss;
  }
  session.close();  // the last collective (finalize): peers see an orderly exit, not a death
  if (leader && !f.metrics_file.empty()) mwms::train::write_metrics(f.metrics_file, summary);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  if (const int code = parse_flags(argc, argv, flags); code >= 0) return code;
  try {
    return run(flags);
  } catch (const mwms::Error& e) {
    std::cerr << "train: error: " << e.what() << std::endl;
  } catch (const std::exception& e) {
    std::cerr << "train: error: " << e.what() << std::endl;
  }
  return 1;
}
