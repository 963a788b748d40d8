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
  int extra_ports = 0;          // free ports for a second cluster, read in the body: extra_ports()
  int attempts = 4;             // runs with fresh ports when a port was taken before its bind
};

/// A socket bound to `port` on all interfaces (dual-stack, or IPv4 without IPv6), -1 if taken.
int bind_any(int port);

/// Distinct free TCP ports below the ephemeral range (bound, then released). A port is never
/// handed out twice by one process, so two clusters of one test cannot share a port.
std::vector<int> free_ports(int n);

/// In a child of run_ranks: the LaunchOptions::extra_ports free ports of this attempt (every
/// rank sees the same list; e.g. make_tf_config(extra_ports(), rank, false) for a reference
/// cluster). Empty outside run_ranks.
const std::vector<int>& extra_ports();

/// TF_CONFIG for task `rank` of a loopback cluster on `ports`.
std::string make_tf_config(const std::vector<int>& ports, int rank, bool with_chief);

/// TF_CONFIG for task `rank` of the cluster whose task i is at `addresses[i]` ("host:port";
/// with_chief: the first is the chief).
std::string make_tf_config(const std::vector<std::string>& addresses, int rank, bool with_chief);

/// A test host: a network namespace and its address (tests/tools/netns_hosts.sh).
struct TestHost {
  std::string netns;    // name under /run/netns
  std::string address;  // IPv4 address of the namespace's eth0
};

/// The test hosts of MWMSTEST_HOSTS ("ns=address,ns=address", exported by
/// `tests/tools/netns_hosts.sh run`); empty when unset: every rank on loopback. Read once.
/// @throws std::runtime_error when the variable is malformed.
const std::vector<TestHost>& test_hosts();

/// Host of `rank` among `hosts` hosts in a world of `n`: consecutive blocks of ranks per host
/// (at n = 4 on 2 hosts ranks 0 and 1 share the first), so the auto transport mixes shared
/// memory inside a host with TCP across hosts.
int host_of(int rank, int n, int hosts);

/// Forks world_size children; child `rank` calls body(rank, tf_config, report) and exits 0, or 1
/// after writing the exception's what() to its output. `report` appends text to the output.
/// With test_hosts() set, child `rank` first enters the network namespace of host
/// host_of(rank, ...) and TF_CONFIG gives every task its host's address.
/// Ports are picked free but released before the children bind them, so another process on the
/// machine can take one in between: when a child reports "address already in use", the others
/// are killed at once and the run starts again with fresh ports (up to options.attempts runs,
/// each logged to stderr); the last run's results are returned.
/// Why not mwmsrun's fix (Note [inherited listener]: the parent listens, each rank adopts its
/// socket through MWMS_LISTEN_FD): the bodies run in forks of this binary, whose env registry
/// reads each variable once per process, so a parent that had read MWMS_LISTEN_FD (several cases
/// in one process, as the netns runs do) would leave every child binding a port its own inherited
/// socket holds; and many bodies' first listener is not their TF_CONFIG port (torchrun and MPI
/// environments, reference clusters on extra_ports(), ports made busy on purpose), which the
/// adoption check would refuse. The retry costs a rerun, never a failure.
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
