// mwmsrun's command line: CLI11, with "-np N" spelled as mpirun and horovodrun spell it and
// nothing before PROGRAM taken for PROGRAM.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "mwmsrun.h"

namespace mwmsrun {

namespace {

// The help's one usage line (CLI11's own would read "Usage: [OPTIONS]": the app has no name when
// parsing a vector, and it knows nothing of PROGRAM).
class UsageFormatter : public CLI::Formatter {
 public:
  std::string make_usage(const CLI::App*, std::string) const override {
    return "Usage: mwmsrun -np N [--chief] [--ps M] [--grace S] [--] PROGRAM [ARGS...]\n"
           "       mwmsrun (-np N | --hosts HOST[:SLOTS],...) [--chief] [--ps M] "
           "--print-tf-config\n";
  }
};

// A whole number in [lo, hi], saying "not a number" for one that is not (CLI::Range alone calls
// "abc" "not in range").
CLI::Validator whole_number_in(int lo, int hi) {
  const std::string range = "[" + std::to_string(lo) + " - " + std::to_string(hi) + "]";
  return CLI::Validator(
      [lo, hi, range](std::string& value) -> std::string {
        char* end = nullptr;
        errno = 0;
        const long v = std::strtol(value.c_str(), &end, 10);
        if (value.empty() || *end != '\0' || errno == ERANGE) {
          return "'" + value + "' is not a number (a whole number in " + range + ")";
        }
        if (v < lo || v > hi) return value + " is not in " + range;
        return std::string();
      },
      "INT in " + range);
}

}  // namespace

int parse_command_line(int argc, char** argv, Options& o) {
  CLI::App app{
      "mwmsrun: starts N local processes of PROGRAM, each with its own TF_CONFIG "
      "(free loopback ports) and, for N > 1, the socket already listening on its port "
      "(inherited; its number in MWMS_LISTEN_FD, which libmwms adopts instead of "
      "binding), prefixes their output with the rank and ends them together"};
  app.add_option("-n,--np", o.np, "number of processes (tasks) to start on this machine")
      ->check(whole_number_in(1, 1024));
  app.add_flag("--chief", o.chief,
               "task 0 is the chief and the others workers 0..N-2 "
               "(default: N workers)");
  app.add_option("--ps", o.num_ps,
                 "also start M parameter-server tasks (TF_CONFIG job \"ps\"), "
                 "after the N training tasks: N + M processes (with --hosts: the last M slots)")
      ->check(whole_number_in(0, 1024));
  app.add_option("--grace", o.grace,
                 "seconds between SIGTERM and SIGKILL when stopping the others "
                 "after a failure")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 3600.0));
  app.add_option("--hosts", o.hosts,
                 "with --print-tf-config: HOST[:SLOTS],... of a multi-host "
                 "job (tasks in that order)");
  app.add_flag("--print-tf-config", o.print_only,
               "print the TF_CONFIG of every task and exit "
               "(of --hosts, else of -np N on localhost)");
  app.add_option("--port-base", o.port_base,
                 "with --hosts: task i on a host listens on "
                 "port-base + its slot on that host")
      ->capture_default_str()
      ->check(CLI::Range(1, 65535 - 1024));
  app.prefix_command();  // PROGRAM and everything after it (or after --) belong to PROGRAM
  app.formatter(std::make_shared<UsageFormatter>());
  // "-np N" as mpirun and horovodrun spell it (CLI11 reads "-np" as -n with value "p"): rewrite
  // it among mwmsrun's own options, never inside PROGRAM's arguments.
  // Anything else that looks like an option before PROGRAM is a mistake (a typo, or PROGRAM's
  // own option without PROGRAM): refused, not taken as the program's name.
  std::vector<std::string> args(argv + 1, argv + argc);
  const std::set<std::string> with_value{"-n", "--np", "--ps", "--grace", "--hosts", "--port-base"};
  const std::set<std::string> flags{"--chief", "--print-tf-config", "-h", "--help"};
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string a = args[i];
    if (a == "--" || a.empty() || a[0] != '-') break;  // PROGRAM starts here
    if (a == "-np") a = args[i] = "--np";
    if (a.rfind("-np", 0) == 0 && a.size() > 3 && std::isdigit(static_cast<unsigned char>(a[3]))) {
      args[i] = "--np=" + a.substr(3);  // -np2, as mpirun accepts it
      continue;
    }
    const std::string name = a.substr(0, a.find('='));
    if (with_value.count(name) != 0) {
      if (name == a) ++i;  // the option's value follows
      continue;
    }
    if (a.size() > 2 && a[0] == '-' && a[1] == 'n' &&
        std::isdigit(static_cast<unsigned char>(a[2]))) {
      continue;  // -n2
    }
    if (flags.count(a) == 0) {
      std::cerr << "mwmsrun: error: unknown option " << a << " (PROGRAM's own options go after "
                << "PROGRAM: mwmsrun -np N [--] PROGRAM ARGS...)\nRun with --help for usage."
                << std::endl;
      return 2;
    }
  }
  std::reverse(args.begin(), args.end());  // CLI11 takes a reversed vector
  try {
    app.parse(args);
    o.command = app.remaining();
    if (!o.command.empty() && o.command.front() == "--") o.command.erase(o.command.begin());
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "mwmsrun: error: " << e.what() << "\nRun with --help for usage." << std::endl;
    return 2;
  }

  return -1;
}

}  // namespace mwmsrun
