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
  /// --backend as given: auto, tcp, shm or mpi; empty when the flag is absent (then the library
  /// reads MWMS_TRANSPORT, default auto, exactly as for any user program).
  std::string backend;
  bool compare_mpi = false;
  bool compare_gloo = false;  ///< --compare gloo (or mpi,gloo): Gloo's all-reduce algorithms
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

/// The CommunicatorOptions::transport for --backend: kFromEnvironment when the flag is absent.
TransportChoice transport_choice(const BenchOptions& options);

/// The backend the run asked for, for the banner and the JSON: the flag, else MWMS_TRANSPORT if
/// set, else "auto".
std::string requested_backend(const BenchOptions& options);

/// "8", "64K", "64M", "1G" (binary multiples, case-insensitive, optional trailing B).
/// @throws mwms::InvalidArgument on anything else.
std::size_t parse_byte_size(std::string_view text);

/// The size after `bytes` in a sweep with step `factor` (> 1): floor(bytes * factor), but at least
/// bytes + 1 so that the sweep always advances; saturates at SIZE_MAX.
std::size_t next_size(std::size_t bytes, double factor);

}  // namespace mwms::bench
