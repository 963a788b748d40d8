// common::listener_problem and adopt_listener (Note [inherited listener],
// src/bootstrap/rendezvous.cc): what a descriptor handed to a task must be before the rendezvous
// adopts it as its listener, and what the error says when it is something else.
#include "common/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <string>

namespace {

using Catch::Matchers::Contains;
using mwms::common::listener_problem;

int port_of(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  return a.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&a)->sin6_port)
                                 : ntohs(reinterpret_cast<sockaddr_in*>(&a)->sin_port);
}

// An IPv4 TCP socket bound to `address` (port chosen by the kernel), listening when `listen`.
int tcp4(const char* address, bool listen) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  REQUIRE(::inet_pton(AF_INET, address, &a.sin_addr) == 1);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  if (listen) REQUIRE(::listen(fd, 4) == 0);
  return fd;
}

// An IPv6 listening socket on :: (v6only as given); -1 where the kernel has no IPv6.
int tcp6_any(int v6only) {
  int fd = ::socket(AF_INET6, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, sizeof(v6only));
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_addr = in6addr_any;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(fd, 4) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

TEST_CASE("listener_problem accepts a listening TCP socket on the task's port", "[unit]") {
  const int any = tcp4("0.0.0.0", true);
  const int port = port_of(any);
  CHECK(listener_problem(any, port, "127.0.0.1").empty());
  CHECK(listener_problem(any, port, "localhost").empty());  // names are not resolved
  CHECK(listener_problem(any, 0, "").empty());              // no port named: any
  const int loop = tcp4("127.0.0.1", true);
  CHECK(listener_problem(loop, port_of(loop), "127.0.0.1").empty());
  ::close(any);
  ::close(loop);
  const int dual = tcp6_any(0);
  if (dual >= 0) {
    CHECK(listener_problem(dual, port_of(dual), "127.0.0.1").empty());  // IPv4 as ::ffff:a.b.c.d
    CHECK(listener_problem(dual, port_of(dual), "::1").empty());
    ::close(dual);
  }
}

TEST_CASE("listener_problem names the descriptor and what it is instead", "[unit]") {
  SECTION("wrong port: the one it has and the one expected") {
    const int fd = tcp4("0.0.0.0", true);
    const int have = port_of(fd);
    const int want = have == 65535 ? 1 : have + 1;
    CHECK(listener_problem(fd, want, "127.0.0.1") ==
          "descriptor " + std::to_string(fd) + " is listening on port " + std::to_string(have) +
              ", not " + std::to_string(want));
    ::close(fd);
  }
  SECTION("not listening") {
    const int fd = tcp4("0.0.0.0", false);
    CHECK(listener_problem(fd, port_of(fd), "127.0.0.1") ==
          "descriptor " + std::to_string(fd) + " is a TCP socket bound to port " +
              std::to_string(port_of(fd)) + " but not listening (no listen(2))");
    ::close(fd);
    const int unbound = ::socket(AF_INET, SOCK_STREAM, 0);
    CHECK_THAT(listener_problem(unbound, 2222, "127.0.0.1"),
               Contains("bound to no port but not listening"));
    ::close(unbound);
  }
  SECTION("not a socket, not open, not TCP") {
    int p[2];
    REQUIRE(::pipe(p) == 0);
    CHECK(listener_problem(p[0], 2222, "h") ==
          "descriptor " + std::to_string(p[0]) + " is a pipe, not a socket");
    ::close(p[0]);
    CHECK_THAT(listener_problem(p[0], 2222, "h"),
               Contains("descriptor " + std::to_string(p[0]) + " is not open in this process"));
    ::close(p[1]);
    FILE* f = std::tmpfile();
    CHECK_THAT(listener_problem(::fileno(f), 2222, "h"), Contains("is a regular file, not a socket"));
    std::fclose(f);
    CHECK_THAT(listener_problem(-1, 2222, "h"), Contains("is not open"));
    const int udp = ::socket(AF_INET, SOCK_DGRAM, 0);
    CHECK_THAT(listener_problem(udp, 2222, "h"), Contains("is a socket but not a TCP one"));
    ::close(udp);
    int pair[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, pair) == 0);
    CHECK_THAT(listener_problem(pair[0], 2222, "h"), Contains("a Unix-domain socket"));
    ::close(pair[0]);
    ::close(pair[1]);
  }
  SECTION("an address the task's host does not reach") {
    const int loop = tcp4("127.0.0.1", true);
    CHECK_THAT(listener_problem(loop, port_of(loop), "127.0.0.2"),
               Contains("bound to 127.0.0.1, not to 127.0.0.2 or 0.0.0.0"));
    CHECK_THAT(listener_problem(loop, port_of(loop), "::1"),
               Contains("an IPv4 socket, which ::1 (IPv6) cannot reach"));
    ::close(loop);
    const int v6only = tcp6_any(1);
    if (v6only >= 0) {
      CHECK_THAT(listener_problem(v6only, port_of(v6only), "127.0.0.1"),
                 Contains("an IPv6-only socket (IPV6_V6ONLY), which 127.0.0.1 (IPv4) cannot reach"));
      ::close(v6only);
    }
  }
}

TEST_CASE("adopt_listener makes the inherited socket close-on-exec, non-blocking and reusable", "[unit]") {
  const int fd = tcp4("127.0.0.1", true);
  REQUIRE((::fcntl(fd, F_GETFD) & FD_CLOEXEC) == 0);
  {
    mwms::common::Socket s = mwms::common::adopt_listener(fd);
    CHECK(s.fd() == fd);
    CHECK((::fcntl(fd, F_GETFD) & FD_CLOEXEC) != 0);
    CHECK((::fcntl(fd, F_GETFL) & O_NONBLOCK) != 0);
    int reuse = 0;
    socklen_t len = sizeof(reuse);
    CHECK(::getsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &reuse, &len) == 0);
    CHECK(reuse != 0);
    CHECK(mwms::common::local_port(s) > 0);
  }
  CHECK(::fcntl(fd, F_GETFD) == -1);  // owned: closed with the Socket
}

TEST_CASE("connect_tcp to a port nobody listens on says refused, not timed out", "[unit]") {
  // Bound, not listening: the port stays ours, and every connect to it is refused at once.
  const int fd = tcp4("127.0.0.1", false);
  const int port = port_of(fd);
  for (double seconds : {0.0, 0.01, 0.05, 0.3}) {
    INFO("deadline in " << seconds << " s");
    std::string error;
    mwms::common::Socket s =
        mwms::common::connect_tcp("127.0.0.1", port, mwms::common::deadline_after(seconds), &error);
    CHECK_FALSE(s.valid());
    CHECK_THAT(error, Contains("refused"));
  }
  ::close(fd);
}
