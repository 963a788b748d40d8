// MWMS_LISTEN_FD (Note [inherited listener], src/bootstrap/rendezvous.cc): a rank handed the
// socket already listening on its port adopts it instead of binding; a descriptor that cannot be
// that listener is a BootstrapError naming the variable, the descriptor, what it is and the port
// expected. Real processes (run_ranks); each child sets the variable itself, after the fork
// (support/child_env.h).
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <stdexcept>
#include <string>

#include "multiproc/launcher.h"
#include "mwms/mwms.h"
#include "support/child_env.h"

namespace {

using Catch::Matchers::Contains;
using mwms::testing::LaunchOptions;
using mwms::testing::run_ranks;

mwms::CommunicatorOptions quick(double connect_seconds) {
  mwms::CommunicatorOptions o;
  o.connect_timeout_seconds = connect_seconds;
  o.timeout_seconds = 10;
  o.transport = mwms::TransportChoice::kTcp;
  return o;
}

int port_of(const std::string& address) { return std::stoi(address.substr(address.rfind(':') + 1)); }

// A socket listening on `port` as mwmsrun makes it: not close-on-exec (as inherited), with
// SO_REUSEADDR (connections queued before the rank adopts it inherit the option, and the rebuilt
// communicator below binds the port again while they are in TIME_WAIT). Throws with "address
// already in use" (the launcher then runs again with fresh ports) when the port is taken.
int listening_socket(int port) {
  const int fd = mwms::testing::bind_any(port);
  const int one = 1;
  if (fd < 0 || ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
      ::listen(fd, 16) != 0) {
    throw std::runtime_error("port " + std::to_string(port) + ": address already in use");
  }
  return fd;
}

float sum_of_ranks(mwms::Communicator& comm, int rank) {
  float x = static_cast<float>(rank + 1);
  comm.all_reduce(&x, 1, mwms::DataType::kFloat32, mwms::ReduceOp::kSum);
  return x;
}

}  // namespace

TEST_CASE("ranks adopt the listening socket named by MWMS_LISTEN_FD", "[tcp]") {
  LaunchOptions opts;
  opts.world_size = 3;
  opts.timeout_seconds = 60;
  auto results = run_ranks(opts, [](int rank, const std::string& tf_config, const auto& report) {
    auto cluster = mwms::resolve_tf_config(tf_config);
    // Held from here on: the library could not bind the port itself (EADDRINUSE) while this
    // socket listens on it, so a rendezvous that succeeds adopted it.
    const int fd = listening_socket(port_of(cluster.ring[static_cast<std::size_t>(rank)]));
    if (!mwms::testing::set_env_in_child("MWMS_LISTEN_FD", std::to_string(fd), report)) return;
    {
      auto comm = mwms::Communicator::create(cluster, quick(20));
      // The rendezvous' listener owns the descriptor and closes it once the links are up.
      errno = 0;
      if (::fcntl(fd, F_GETFD) != -1 || errno != EBADF) {
        throw std::runtime_error("descriptor " + std::to_string(fd) + " still open after create");
      }
      // Every rank is past create (its listener closed) once this all-reduce completes.
      report("first " + std::to_string(sum_of_ranks(*comm, rank)));
    }
    // The number now names something else; a rebuilt communicator must bind its port itself
    // rather than inspect (or adopt) it again.
    const int reused = ::open("/dev/null", O_RDONLY);
    auto again = mwms::Communicator::create(cluster, quick(20));
    report("second " + std::to_string(sum_of_ranks(*again, rank)) +
           (reused == fd ? " (number reused)" : ""));
    ::close(reused);
  });
  if (mwms::testing::skipped_for_cached_env(results)) return;
  for (const auto& r : results) {
    INFO(mwms::testing::describe(results));
    CHECK(r.exit_code == 0);
    CHECK_THAT(r.output, Contains("first 6.0"));
    CHECK_THAT(r.output, Contains("second 6.0"));
  }
}

TEST_CASE("an MWMS_LISTEN_FD that cannot be the listener is a BootstrapError naming it",
          "[tcp][fault]") {
  // Each rank gets a different wrong descriptor; every one fails before it contacts anyone.
  LaunchOptions opts;
  opts.world_size = 4;
  opts.timeout_seconds = 60;
  auto results = run_ranks(opts, [](int rank, const std::string& tf_config, const auto& report) {
    auto cluster = mwms::resolve_tf_config(tf_config);
    const int port = port_of(cluster.ring[static_cast<std::size_t>(rank)]);
    std::string value;
    if (rank == 0) {  // listening, on another port
      const int other = mwms::testing::free_ports(1)[0];
      value = std::to_string(listening_socket(other));
      report("other port " + std::to_string(other));
    } else if (rank == 1) {  // a pipe
      int p[2];
      if (::pipe(p) != 0) throw std::runtime_error("pipe");
      value = std::to_string(p[0]);
    } else if (rank == 2) {  // bound to the right port, never listen(2)ed
      const int fd = mwms::testing::bind_any(port);
      if (fd < 0) throw std::runtime_error("port " + std::to_string(port) + ": address already in use");
      value = std::to_string(fd);
    } else {
      value = "3x";
    }
    if (!mwms::testing::set_env_in_child("MWMS_LISTEN_FD", value, report)) return;
    try {
      mwms::Communicator::create(cluster, quick(2));
      report("created");
    } catch (const mwms::BootstrapError& e) {
      report(std::string("BootstrapError: ") + e.what());
    } catch (const mwms::InvalidArgument& e) {
      report(std::string("InvalidArgument: ") + e.what());
    }
    report("expected port " + std::to_string(port));
  });
  if (mwms::testing::skipped_for_cached_env(results)) return;
  INFO(mwms::testing::describe(results));
  REQUIRE(results.size() == 4);
  for (const auto& r : results) {
    CHECK(r.exit_code == 0);
    CHECK_THAT(r.output, !Contains("created"));
  }
  auto reported = [&](int rank, const std::string& prefix) {
    const std::string& out = results[static_cast<std::size_t>(rank)].output;
    const std::size_t at = out.find(prefix);
    return at == std::string::npos ? std::string() : out.substr(at + prefix.size(),
                                                                out.find('\n', at) - at - prefix.size());
  };
  // Wrong port: the one it has and the one expected.
  CHECK_THAT(results[0].output, Contains("BootstrapError: MWMS_LISTEN_FD="));
  CHECK_THAT(results[0].output, Contains("cannot be the listener of worker 0"));
  CHECK_THAT(results[0].output, Contains("is listening on port " + reported(0, "other port ") +
                                         ", not " + reported(0, "expected port ")));
  // Not a socket.
  CHECK_THAT(results[1].output, Contains("cannot be the listener of worker 1"));
  CHECK_THAT(results[1].output, Contains("is a pipe, not a socket"));
  // Not listening.
  CHECK_THAT(results[2].output, Contains("is a TCP socket bound to port " +
                                         reported(2, "expected port ") + " but not listening"));
  // Not a number: the variable's own error (docs/env.md), naming the value and the task.
  CHECK_THAT(results[3].output, Contains("InvalidArgument: MWMS_LISTEN_FD=3x is not a descriptor "
                                         "number"));
  CHECK_THAT(results[3].output, Contains("worker 3"));
}
