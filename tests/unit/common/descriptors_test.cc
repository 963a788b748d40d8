// Note [descriptor budget] (src/common/descriptors.cc): with no descriptor left, every call that
// needs one (socket, accept, memfd) fails at once with a text naming the limit, instead of
// retrying until a deadline or logging a refused accept in a loop. Each case runs in a forked
// child whose RLIMIT_NOFILE is lowered to what it has open, so this process keeps its own.
#include "common/descriptors.h"

#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>

#include "bootstrap/handshake.h"
#include "collective/transport/shm/shm_segment.h"
#include "common/socket.h"
#include "mwms/errors.h"

namespace {

using Catch::Matchers::Contains;

// Leaves this process no free descriptor: a low soft limit, then every number below it taken
// (duplicates of stdin), so the next socket/accept/memfd gets EMFILE. (A limit of 0 would do
// it too, but then poll() itself refuses its arguments with EINVAL.)
void exhaust() {
  rlimit r{};
  ::getrlimit(RLIMIT_NOFILE, &r);
  r.rlim_cur = static_cast<rlim_t>(mwms::common::open_descriptors() + 16);
  if (::setrlimit(RLIMIT_NOFILE, &r) != 0) throw std::runtime_error("setrlimit failed");
  while (::dup(0) >= 0) {
  }
  if (errno != EMFILE) throw std::runtime_error("dup failed otherwise");
}

// Runs `body` in a child (which calls exhaust()); returns what it wrote or "crashed".
std::string at_the_limit(const std::function<std::string()>& body) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(fds[0]);
    std::string out;
    try {
      out = body();
    } catch (const std::exception& e) {
      out = std::string("threw: ") + e.what();
    }
    (void)!::write(fds[1], out.data(), out.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<std::size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? out : "crashed";
}

}  // namespace

TEST_CASE("descriptors: the budget counts what a rank opens", "[unit][common]") {
  mwms::common::DescriptorBudget b;
  CHECK(b.total() == 0);  // a world of one opens nothing
  b.world_size = 4;
  b.tcp_peers = 3;
  b.streams_per_peer = 3;
  CHECK(b.total() == 1 + 3 + 9 + 3 + 2);
  CHECK(b.describe() == "1 listener, 3 control links, 9 TCP streams to 3 peers "
                        "(MWMS_NSOCKS_PERPEER=3), 3 epoll sets, 2 for handshakes");
  b.tcp_peers = 1;
  b.shm_peers = 2;
  b.streams_per_peer = 1;
  CHECK(b.total() == 1 + 3 + 1 + 2 + 2);
  CHECK(mwms::common::open_descriptors() >= 3);
  CHECK(mwms::common::errno_description(ENOENT) == std::strerror(ENOENT));
}

TEST_CASE("descriptors: out of them, socket, accept and memfd fail at once naming the limit",
          "[unit][common]") {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  SUCCEED("not under the sanitizers (their runtime needs descriptors itself)");
  return;
#endif
  // connect: no retry until the 5 s deadline.
  std::string got = at_the_limit([] {
    exhaust();
    std::string error;
    bool exhausted = false;
    const auto start = std::chrono::steady_clock::now();
    mwms::common::Socket s = mwms::common::connect_tcp(
        "127.0.0.1", 9, mwms::common::deadline_after(5), &error, &exhausted);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return std::string(exhausted && !s.valid() && secs < 1 ? "at once: " : "late: ") + error;
  });
  CHECK_THAT(got, Contains("at once: out of file descriptors (Too many open files)"));
  CHECK_THAT(got, Contains("(ulimit -n)"));
  // memfd of a shared-memory segment.
  got = at_the_limit([] {
    exhaust();
    mwms::collective::ShmSegment::create(0, 2, 1 << 20, "job");
    return std::string("created");
  });
  CHECK_THAT(got, Contains("threw: shared memory: memfd_create failed: out of file descriptors"));
  // accept: a connection is queued, the leader has no descriptor to take it.
  got = at_the_limit([] {
    int error = 0;
    mwms::common::Socket listener = mwms::common::listen_tcp(0, &error);
    std::string ignored;
    mwms::common::Socket client = mwms::common::connect_tcp(
        "127.0.0.1", mwms::common::local_port(listener), mwms::common::deadline_after(5), &ignored);
    exhaust();
    mwms::bootstrap::HandshakeServer server(listener, mwms::bootstrap::AuthKey(),
                                            {mwms::bootstrap::MessageKind::kHello}, 3.0);
    try {
      server.next(mwms::common::deadline_after(3));
      return std::string("no error");
    } catch (const mwms::BootstrapError& e) {
      return std::string("BootstrapError: ") + e.what();
    }
  });
  CHECK_THAT(got, Contains("BootstrapError: cannot accept a connection: out of file descriptors"));
}
