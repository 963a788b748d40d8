#include "common/options.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <sstream>

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

TransportChoice transport_choice(const BenchOptions& options) {
  if (options.backend == "auto") return TransportChoice::kAuto;
  if (options.backend == "tcp") return TransportChoice::kTcp;
  if (options.backend == "shm") return TransportChoice::kShm;
  if (options.backend == "mpi") return TransportChoice::kMpi;
  return TransportChoice::kFromEnvironment;  // flag absent (CLI11 refuses any other value)
}

std::string requested_backend(const BenchOptions& options) {
  if (!options.backend.empty()) return options.backend;
  const char* env = std::getenv("MWMS_TRANSPORT");
  return env != nullptr && *env != '\0' ? std::string(env) : "auto";
}

namespace {

void validate(const BenchOptions& o) {
  if (o.min_bytes > o.max_bytes) {
    throw InvalidArgument("--minbytes " + std::to_string(o.min_bytes) + " is larger than --maxbytes " +
                          std::to_string(o.max_bytes));
  }
  if (!(o.step_factor > 1)) throw InvalidArgument("--stepfactor must be > 1");
  if (o.iters < 1) throw InvalidArgument("--iters must be >= 1");
  if (o.warmup_iters < 0) throw InvalidArgument("--warmup_iters must be >= 0");
  if (o.root < 0) throw InvalidArgument("--root must be >= 0");
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
  app.add_option("--backend,--transport", o.backend,
                 "Transport of libmwms's links: auto (the default users get: shared memory on one "
                 "host, TCP between hosts), tcp, shm or mpi; absent: MWMS_TRANSPORT")
      ->check(CLI::IsMember({"auto", "tcp", "shm", "mpi"}));
  app.add_option("--compare", compare,
                 "Also time these implementations in the same run: mpi (MPI's collective, under "
                 "mpirun), gloo (Gloo's ring-chunked and halving-doubling all-reduce over its TCP "
                 "transport), mpi,gloo, or none")
      ->check(CLI::IsMember({"mpi", "gloo", "mpi,gloo", "gloo,mpi", "none"}));
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
    o.compare_mpi = compare.find("mpi") != std::string::npos;
    o.compare_gloo = compare.find("gloo") != std::string::npos;
    validate(o);
    if (o.backend == "mpi") {  // a world of one has no links: nothing would go over MPI
      const auto sources = inspect_environment().sources;
      auto mpi = [](const LaunchSourceReport& s) { return s.source == "mpi"; };
      if (std::none_of(sources.begin(), sources.end(), mpi)) {
        throw InvalidArgument("--backend mpi: this process was not started by mpirun (or another "
                              "MPI launcher), so there is no MPI world to measure; run e.g. "
                              "mpirun -np 2 " + std::string(program) + " --backend mpi");
      }
    }
  } catch (const CLI::ParseError& e) {
    // CLI11 prints --help to stdout and errors to stderr; exit() gives their status.
    std::ostringstream out, err;
    *exit_status = app.exit(e, out, err);
    if (print) {
      std::cout << out.str() << std::flush;
      std::cerr << err.str() << std::flush;
    }
    return std::nullopt;
  } catch (const Error& e) {
    if (print) std::cerr << program << ": " << e.message() << "\n";
    *exit_status = 2;
    return std::nullopt;
  }
  return o;
}

}  // namespace mwms::bench
