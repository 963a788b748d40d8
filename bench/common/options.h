// Command line of every *_perf tool. Flag names are nccl-tests' (-b/-e/-f/-n/-w/-c/-d/-o), with the
// house-style long spellings (--min-bytes, ...) accepted as aliases.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "mwms/options.h"
#include "mwms/types.h"

namespace mwms::bench {

struct BenchOptions {
  std::size_t min_bytes = 8;
  std::size_t max_bytes = std::size_t{64} << 20;
  double step_factor = 2;
  int iters = 20;
  int warmup_iters = 5;
  int check = 1;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  /// --backend as given: auto, tcp, shm or mpi (the engine's transports), or nccl (device
  /// buffers through DeviceCommunicator, bench/common/device_bench.h); empty when the flag is
  /// absent (then the library reads MWMS_TRANSPORT, default auto, exactly as for any user program).
  std::string backend;
  bool compare_mpi = false;
  bool compare_gloo = false;  ///< --compare gloo (or mpi,gloo): Gloo's all-reduce algorithms
  bool compare_nccl =
      false;  ///< --compare nccl: raw NCCL on the same device buffers (--backend nccl)
  std::string gloo_store = "/tmp";  ///< --gloo-store: where Gloo's file-store rendezvous lives
  std::string json_path;  ///< empty: no JSON file
  int root = 0;           ///< -r/--root, rooted collectives only; checked against the world size later
};

/// Which of the collective-specific flags a tool takes.
struct ToolFlags {
  bool with_root = false;  ///< -r/--root (broadcast); other tools do not accept it
  bool with_op = true;     ///< -o/--op (all_reduce, reduce_scatter); refused by the others
};

/// Parses argv. Returns the options, or std::nullopt after --help (printed) or an error (printed
/// to stderr); then `*exit_status` holds the status the program should exit with (0 after
/// --help, 2 for a value or a flag this tool refuses, CLI11's own status for a malformed line).
/// `print` false keeps quiet (non-zero ranks under mpirun, so messages appear once).
/// A tool without a reduction (`tool.with_op` false) refuses -o/--op with a message saying so,
/// rather than ignoring it, and does not list it in --help.
std::optional<BenchOptions> parse_options(int argc, char** argv, std::string_view program,
                                          bool print, int* exit_status, ToolFlags tool = {});

/// The CommunicatorOptions::transport for --backend: unset (MWMS_TRANSPORT) when the flag is absent
/// (and for nccl, which has no engine transport).
std::optional<TransportChoice> transport_choice(const BenchOptions& options);

/// True for --backend nccl: the run is on device buffers (bench/common/device_bench.h).
bool device_backend(const BenchOptions& options);

/// What --compare asks for: the implementations timed beside libmwms.
struct CompareSet {
  bool mpi = false;   ///< MPI's collective (under mpirun)
  bool gloo = false;  ///< Gloo's two all-reduce algorithms
  bool nccl = false;  ///< raw NCCL on the device buffers (--backend nccl)
};

/// Parses --compare's value: a comma-separated list of mpi, gloo and nccl, or none (alone).
/// @throws mwms::InvalidArgument naming the value and the valid ones (a typo, an empty item,
///   "none" combined with another).
CompareSet parse_compare(std::string_view text);

/// --backend's value checked: auto, tcp, shm, mpi or nccl. @throws mwms::InvalidArgument naming
/// the value and the valid ones.
void check_backend(std::string_view text);

/// The backend the run asked for, for the banner and the JSON: the flag, else MWMS_TRANSPORT if
/// set, else "auto".
std::string requested_backend(const BenchOptions& options);

/// bucket_perf's command line (bucket_perf.cc).
struct BucketOptions {
  std::size_t tensors = 200;                        ///< -t/--tensors: gradient tensors
  std::size_t total_bytes = std::size_t{25} << 20;  ///< -s/--size: all tensors together
  int iters = 20;
  int warmup_iters = 5;
  int check = 1;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  /// --backend: auto, tcp, shm, mpi (host buffers through the strategy) or nccl (device buffers
  /// through DeviceCommunicator); empty: MWMS_TRANSPORT decides, host buffers.
  std::string backend;
  std::size_t bytes_per_pack = 0;  ///< --bytes-per-pack; 0: the strategy's (MWMS_BYTES_PER_PACK)
  std::string json_path;
};

/// Parses bucket_perf's argv as parse_options() does (same statuses: 0 after --help, 2 for a bad
/// value, CLI11's own for a malformed line; `print` false keeps quiet).
std::optional<BucketOptions> parse_bucket_options(int argc, char** argv, std::string_view program,
                                                  bool print, int* exit_status);

/// "8", "64K", "64M", "1G" (binary multiples, case-insensitive, optional trailing B).
/// @throws mwms::InvalidArgument on anything else.
std::size_t parse_byte_size(std::string_view text);

/// The size after `bytes` in a sweep with step `factor` (> 1): floor(bytes * factor), but at least
/// bytes + 1 so that the sweep always advances; saturates at SIZE_MAX.
std::size_t next_size(std::size_t bytes, double factor);

}  // namespace mwms::bench
