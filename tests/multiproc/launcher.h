// Runs N real processes on loopback (gloo multiproc_test idea): each child gets its rank and a
// TF_CONFIG for a cluster of free loopback ports, runs the body, and reports through a pipe.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace mwms::testing {

struct ChildResult {
  int rank = -1;
  int exit_code = -1;      // 0: the body returned; 1: it threw (message in output)
  int signal = 0;          // non-zero when the child died from a signal
  bool timed_out = false;  // the parent killed it after the launch timeout
  double seconds = 0;      // wall time until it exited
  std::string output;      // what the child reported (exception text, values)
};

struct LaunchOptions {
  int world_size = 2;
  double timeout_seconds = 60;  // the parent SIGKILLs children still running after this
  bool with_chief = false;      // "chief" job of one + (world_size - 1) workers
};

/// A socket bound to `port` on all interfaces (dual-stack, or IPv4 without IPv6), -1 if taken.
int bind_any(int port);

/// Distinct free TCP ports below the ephemeral range (bound, then released).
std::vector<int> free_ports(int n);

/// TF_CONFIG for task `rank` of a loopback cluster on `ports`.
std::string make_tf_config(const std::vector<int>& ports, int rank, bool with_chief);

/// Forks world_size children; child `rank` calls body(rank, tf_config, report) and exits 0, or 1
/// after writing the exception's what() to its output. `report` appends text to the output.
std::vector<ChildResult> run_ranks(
    const LaunchOptions& options,
    const std::function<void(int rank, const std::string& tf_config,
                             const std::function<void(const std::string&)>& report)>& body);

/// Heap allocations made by this process so far (alloc_counter.cc replaces operator new).
long allocations();

/// Runs `round` once (scratch and plans grow), then 20 times counting heap allocations; reports
/// the count and throws std::runtime_error unless it is 0 (DESIGN "No allocation per collective").
void expect_no_allocations(const std::function<void()>& round,
                           const std::function<void(const std::string&)>& report);

/// Joins every child's output for failure messages.
std::string describe(const std::vector<ChildResult>& results);

}  // namespace mwms::testing
