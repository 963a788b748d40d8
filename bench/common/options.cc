#include "common/options.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <sstream>

#include "common/flag_checks.h"
#include "mwms/cluster.h"
#include "mwms/errors.h"

namespace mwms::bench {

std::size_t parse_byte_size(std::string_view text) {
  std::string s(text);
  while (!s.empty() && (s.back() == 'b' || s.back() == 'B')) s.pop_back();
  std::size_t shift = 0;
  if (!s.empty()) {
    switch (std::toupper(static_cast<unsigned char>(s.back()))) {
      case 'K': shift = 10; break;
      case 'M': shift = 20; break;
      case 'G': shift = 30; break;
      default: break;
    }
    if (shift != 0) s.pop_back();
  }
  if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos) {
    throw InvalidArgument("bad byte size '" + std::string(text) + "' (expected e.g. 8, 64K, 64M, 1G)");
  }
  unsigned long long value = std::stoull(s);
  if (value > (std::numeric_limits<std::size_t>::max() >> shift)) {
    throw InvalidArgument("byte size '" + std::string(text) + "' is too large");
  }
  return static_cast<std::size_t>(value) << shift;
}

std::size_t next_size(std::size_t bytes, double factor) {
  // A factor like 1.5 must still advance from tiny sizes (8 * 1.5 = 12, but 1 * 1.5 rounds to 1).
  double next = std::floor(static_cast<double>(bytes) * factor);
  if (next <= static_cast<double>(bytes)) return bytes + 1;
  if (next >= static_cast<double>(std::numeric_limits<std::size_t>::max())) {
    return std::numeric_limits<std::size_t>::max();
  }
  return static_cast<std::size_t>(next);
}

bool device_backend(const BenchOptions& options) { return options.backend == "nccl"; }

CompareSet parse_compare(std::string_view text) {
  // Checked here rather than with CLI11's IsMember, whose error lists the set with its own commas
  // ("{mpi,gloo,mpi,gloo,...}") and exits 105: a typo is a usage error (status 2) like any other.
  const auto refuse = [&](const std::string& why) {
    return InvalidArgument("--compare '" + std::string(text) + "': " + why +
                           " (valid: mpi, gloo, nccl, a comma-separated list of them such as "
                           "mpi,gloo, or none)");
  };
  CompareSet set;
  bool none = false;
  std::size_t items = 0;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = text.find(',', start);
    const std::string_view item = text.substr(
        start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    ++items;
    if (item == "mpi") {
      set.mpi = true;
    } else if (item == "gloo") {
      set.gloo = true;
    } else if (item == "nccl") {
      set.nccl = true;
    } else if (item == "none") {
      none = true;
    } else if (item.empty()) {
      throw refuse("empty item");
    } else {
      throw refuse("unknown implementation '" + std::string(item) + "'");
    }
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  if (none && items > 1) throw refuse("none cannot be combined with another");
  return set;
}

void check_backend(std::string_view text) {
  for (const char* valid : {"auto", "tcp", "shm", "mpi", "nccl"}) {
    if (text == valid) return;
  }
  throw InvalidArgument("--backend '" + std::string(text) +
                        "': not a backend (valid: auto, tcp, shm, mpi, nccl)");
}

std::optional<TransportChoice> transport_choice(const BenchOptions& options) {
  if (options.backend == "auto") return TransportChoice::kAuto;
  if (options.backend == "tcp") return TransportChoice::kTcp;
  if (options.backend == "shm") return TransportChoice::kShm;
  if (options.backend == "mpi") return TransportChoice::kMpi;
  return std::nullopt;  // flag absent, or nccl (no engine transport): MWMS_TRANSPORT
}

std::string requested_backend(const BenchOptions& options) {
  if (!options.backend.empty()) return options.backend;
  const char* env = std::getenv("MWMS_TRANSPORT");
  return env != nullptr && *env != '\0' ? std::string(env) : "auto";
}

namespace {

// A command-line error of CLI11 (or --help): --help goes to stdout with status 0; an error goes to
// stderr prefixed with the tool's name, with status 2 like every other bad flag or value
// (bench/README.md "Exit status"), not CLI11's own codes (105-114).
int parse_error_exit(const CLI::App& app, const CLI::ParseError& e, std::string_view program,
                     bool print) {
  std::ostringstream out, err;
  const int status = app.exit(e, out, err);
  if (print) {
    std::cout << out.str() << std::flush;
    if (!err.str().empty()) std::cerr << program << ": " << err.str() << std::flush;
  }
  return status == 0 ? 0 : 2;
}

void validate(const BenchOptions& o) {
  if (o.min_bytes > o.max_bytes) {
    throw InvalidArgument("--minbytes " + std::to_string(o.min_bytes) + " is larger than --maxbytes " +
                          std::to_string(o.max_bytes));
  }
  check_flag_above("-f/--stepfactor", o.step_factor, 1);
  check_flag_at_least("-n/--iters", o.iters, 1);
  check_flag_at_least("-w/--warmup_iters", o.warmup_iters, 0);
  check_flag_0_or_1("-c/--check", o.check);
  check_flag_at_least("-r/--root", o.root, 0);
  const bool device = o.backend == "nccl";
  if (o.compare_nccl && !device) {
    throw InvalidArgument(
        "--compare nccl times raw NCCL on device buffers: it needs --backend nccl");
  }
  if (device && (o.compare_mpi || o.compare_gloo)) {
    throw InvalidArgument(std::string("--compare ") + (o.compare_mpi ? "mpi" : "gloo") +
                          " times host buffers: with --backend nccl only --compare nccl applies");
  }
}

// --backend mpi in a process that mpirun did not start: a world of one has no links, so nothing
// would go over MPI; refused with the command to run instead. @throws InvalidArgument.
void check_mpi_backend(const std::string& backend, std::string_view program) {
  if (backend != "mpi") return;
  const auto sources = inspect_environment().sources;
  auto mpi = [](const LaunchSourceReport& s) { return s.source == "mpi"; };
  if (std::none_of(sources.begin(), sources.end(), mpi)) {
    throw InvalidArgument("--backend mpi: this process was not started by mpirun (or another "
                          "MPI launcher), so there is no MPI world to measure; run e.g. "
                          "mpirun -np 2 " + std::string(program) + " --backend mpi");
  }
}

// --json FILE whose directory does not exist or cannot be written: refused before a sweep runs
// for minutes and only then fails to write it. @throws InvalidArgument.
void check_json_path(const std::string& path) {
  if (path.empty()) return;
  const std::size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  if (::access(dir.c_str(), W_OK) != 0) {
    throw InvalidArgument("--json " + path + ": cannot write in " + dir + " (" +
                          std::strerror(errno) + ")");
  }
}

}  // namespace

std::optional<BenchOptions> parse_options(int argc, char** argv, std::string_view program,
                                          bool print, int* exit_status, ToolFlags tool) {
  BenchOptions o;
  std::string min_bytes = "8", max_bytes = "64M", dtype = "float32", op = "sum", compare;
  CLI::App app{std::string(program) + ": libmwms collective benchmark (nccl-tests flags)"};
  app.add_option("-b,--minbytes,--min-bytes", min_bytes, "Smallest message in bytes (K/M/G ok)")
      ->capture_default_str();
  app.add_option("-e,--maxbytes,--max-bytes", max_bytes, "Largest message in bytes (K/M/G ok)")
      ->capture_default_str();
  app.add_option("-f,--stepfactor,--factor", o.step_factor, "Multiply the size by this per row")
      ->capture_default_str();
  app.add_option("-n,--iters", o.iters, "Timed iterations per size")->capture_default_str();
  app.add_option("-w,--warmup_iters,--warmup", o.warmup_iters, "Untimed iterations per size")
      ->capture_default_str();
  app.add_option("-c,--check", o.check, "Verify the result of the first iteration (0/1)")
      ->capture_default_str();
  app.add_option("-d,--datatype,--dtype", dtype,
                 "float32|float64|float16|bfloat16|int32|int64")->capture_default_str();
  // Without a reduction the flag is still parsed (hidden from --help) so that it is refused with
  // a reason and status 2 below, not silently ignored nor reported as an unknown argument.
  CLI::Option* op_flag =
      app.add_option("-o,--op", op, "sum|mean|min|max|prod")->capture_default_str();
  if (!tool.with_op) op_flag->group("");
  CLI::Option* backend_flag = app.add_option(
      "--backend,--transport", o.backend,
      "Transport of libmwms's links: auto (the default users get: shared memory on one host, TCP "
      "between hosts), tcp, shm or mpi; or nccl (device buffers through DeviceCommunicator, one "
      "GPU per rank); absent: MWMS_TRANSPORT");
  CLI::Option* compare_flag = app.add_option(
      "--compare", compare,
      "Also time these implementations in the same run: mpi (MPI's collective, under mpirun), "
      "gloo (Gloo's ring-chunked and halving-doubling all-reduce over its TCP transport), nccl "
      "(raw NCCL on the same device buffers, with --backend nccl), a comma-separated list such as "
      "mpi,gloo, or none");
  app.add_option("--gloo-store", o.gloo_store,
                 "Directory (shared by every rank) for Gloo's file-store rendezvous")
      ->capture_default_str();
  app.add_option("--json", o.json_path, "Write the rows as a JSON array to this file");
  if (tool.with_root) {
    app.add_option("-r,--root", o.root, "Rank whose buffer is broadcast")->capture_default_str();
  }
  try {
    app.parse(argc, argv);
    if (!tool.with_op && op_flag->count() > 0) {
      throw InvalidArgument("-o/--op " + op + ": " + std::string(program) +
                            " takes no reduction op (only all_reduce_perf and "
                            "reduce_scatter_perf reduce)");
    }
    o.min_bytes = parse_byte_size(min_bytes);
    o.max_bytes = parse_byte_size(max_bytes);
    o.dtype = parse_dtype(dtype);
    o.op = parse_reduce_op(op);
    if (backend_flag->count() > 0) check_backend(o.backend);
    if (compare_flag->count() > 0) {
      const CompareSet set = parse_compare(compare);
      o.compare_mpi = set.mpi;
      o.compare_gloo = set.gloo;
      o.compare_nccl = set.nccl;
    }
    validate(o);
    check_mpi_backend(o.backend, program);
    check_json_path(o.json_path);
  } catch (const CLI::ParseError& e) {
    *exit_status = parse_error_exit(app, e, program, print);
    return std::nullopt;
  } catch (const Error& e) {
    if (print) std::cerr << program << ": " << e.message() << "\n";
    *exit_status = 2;
    return std::nullopt;
  }
  return o;
}

std::optional<BucketOptions> parse_bucket_options(int argc, char** argv, std::string_view program,
                                                  bool print, int* exit_status) {
  BucketOptions o;
  std::string size = "25M", dtype = "float32", op = "sum", bytes_per_pack = "0";
  long long tensors = static_cast<long long>(o.tensors);  // signed: "-t -1" must not wrap
  CLI::App app{std::string(program) +
               ": many small gradient tensors all-reduced through the strategy's buckets against "
               "one all-reduce per tensor"};
  app.add_option("-t,--tensors", tensors, "Gradient tensors (sizes like a CNN's)")
      ->capture_default_str();
  app.add_option("-s,--size", size, "All tensors together, in bytes (K/M/G ok)")
      ->capture_default_str();
  app.add_option("-n,--iters", o.iters, "Timed iterations of each path")->capture_default_str();
  app.add_option("-w,--warmup_iters,--warmup", o.warmup_iters, "Untimed iterations of each path")
      ->capture_default_str();
  app.add_option("-c,--check", o.check, "Verify both paths' first result exactly (0/1)")
      ->capture_default_str();
  app.add_option("-d,--datatype,--dtype", dtype, "float32|float64|float16|bfloat16|int32|int64")
      ->capture_default_str();
  app.add_option("-o,--op", op, "sum|mean|min|max|prod")->capture_default_str();
  CLI::Option* backend_flag = app.add_option(
      "--backend,--transport", o.backend,
      "auto, tcp, shm or mpi: host buffers through MultiWorkerMirroredStrategy (the transport "
      "of its links); nccl: device buffers through DeviceCommunicator; absent: MWMS_TRANSPORT");
  app.add_option("--bytes-per-pack", bytes_per_pack,
                 "Bucket size of the strategy (K/M/G ok); 0: MWMS_BYTES_PER_PACK (default 4M)")
      ->capture_default_str();
  app.add_option("--json", o.json_path, "Write the row as a JSON array to this file");
  try {
    app.parse(argc, argv);
    if (backend_flag->count() > 0) check_backend(o.backend);
    o.total_bytes = parse_byte_size(size);
    o.bytes_per_pack = parse_byte_size(bytes_per_pack);
    o.dtype = parse_dtype(dtype);
    o.op = parse_reduce_op(op);
    check_flag_at_least("-t/--tensors", tensors, 1);
    o.tensors = static_cast<std::size_t>(tensors);
    if (o.total_bytes / dtype_size(o.dtype) < o.tensors) {
      throw InvalidArgument("--size " + std::to_string(o.total_bytes) + " holds fewer " +
                            std::string(to_string(o.dtype)) + " elements than --tensors " +
                            std::to_string(o.tensors));
    }
    check_flag_at_least("-n/--iters", o.iters, 1);
    check_flag_at_least("-w/--warmup_iters", o.warmup_iters, 0);
    check_flag_0_or_1("-c/--check", o.check);
    check_mpi_backend(o.backend, program);
    check_json_path(o.json_path);
  } catch (const CLI::ParseError& e) {
    *exit_status = parse_error_exit(app, e, program, print);
    return std::nullopt;
  } catch (const Error& e) {
    if (print) std::cerr << program << ": " << e.message() << "\n";
    *exit_status = 2;
    return std::nullopt;
  }
  return o;
}

}  // namespace mwms::bench
