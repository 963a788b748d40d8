#include "common/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <thread>

#include "common/descriptors.h"

namespace mwms::common {

double seconds_left(Deadline d) {
  return std::chrono::duration<double>(d - Clock::now()).count();
}

Deadline deadline_after(double seconds) {
  // Clamp: a huge timeout (1e11 s) would overflow the clock's representation into the past.
  constexpr double kMaxSeconds = 1e8;  // ~3 years is "forever" for a training job
  seconds = std::min(std::max(seconds, 0.0), kMaxSeconds);
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(seconds));
}

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = other.release();
  }
  return *this;
}

void Socket::close() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::string IoResult::describe() const {
  switch (status) {
    case IoStatus::kOk: return "ok";
    case IoStatus::kTimeout: return "timed out";
    case IoStatus::kClosed: return "connection closed by peer";
    case IoStatus::kError: return errno_description(error);  // Note [descriptor budget]
  }
  return "unknown";
}

namespace {

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL, 0) | O_NONBLOCK); }

int poll_ms(Deadline deadline) {
  double left = seconds_left(deadline);
  if (left <= 0) return 0;
  return static_cast<int>(std::min(left * 1000.0 + 1, 1000.0 * 60));
}

// Waits until fd is ready for `events` or the deadline passes.
IoResult wait_fd(int fd, short events, Deadline deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int ms = poll_ms(deadline);
    if (ms <= 0) return {IoStatus::kTimeout, 0};
    int rc = ::poll(&p, 1, ms);
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) return {IoStatus::kError, errno};
    if (rc > 0) return {};
  }
}

}  // namespace

Socket listen_tcp(int port, int* error) {
  *error = 0;
  int one = 1;
  int zero = 0;
  Socket s(::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (s.valid()) {
    ::setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    ::setsockopt(s.fd(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    sockaddr_in6 addr{};
    addr.sin6_family = AF_INET6;
    addr.sin6_addr = in6addr_any;
    addr.sin6_port = htons(static_cast<uint16_t>(port));
    if (::bind(s.fd(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
        ::listen(s.fd(), 128) == 0) {
      set_nonblocking(s.fd());
      return s;
    }
    *error = errno;
    if (*error == EADDRINUSE) return Socket();
    s.close();
  }
  s = Socket(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s.valid()) {
    *error = errno;
    return Socket();
  }
  ::setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::bind(s.fd(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(s.fd(), 128) != 0) {
    *error = errno;
    return Socket();
  }
  set_nonblocking(s.fd());
  *error = 0;
  return s;
}

int local_port(const Socket& listener) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (::getsockname(listener.fd(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) return -1;
  if (addr.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
}

namespace {

// "a pipe", "a regular file", ...: what a descriptor that is not a socket is.
std::string kind_of(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return "not inspectable (" + std::string(std::strerror(errno)) + ")";
  switch (st.st_mode & S_IFMT) {
    case S_IFREG: return "a regular file";
    case S_IFIFO: return "a pipe";
    case S_IFCHR: return "a character device";
    case S_IFDIR: return "a directory";
    case S_IFBLK: return "a block device";
    default: return "not a socket";
  }
}

int sockopt_int(int fd, int level, int name, int* value) {
  socklen_t len = sizeof(*value);
  return ::getsockopt(fd, level, name, value, &len);
}

// Whether a socket bound to `bound` (its family's address) is reached by connecting to `host`;
// empty when it is (or when host is a name, which is not resolved here), else why not.
std::string reach_problem(const sockaddr_storage& bound, int fd, const std::string& host) {
  in_addr v4{};
  in6_addr v6{};
  const bool host_v4 = ::inet_pton(AF_INET, host.c_str(), &v4) == 1;
  const bool host_v6 = !host_v4 && ::inet_pton(AF_INET6, host.c_str(), &v6) == 1;
  if (!host_v4 && !host_v6) return "";
  char text[INET6_ADDRSTRLEN] = {0};
  if (bound.ss_family == AF_INET) {
    const auto& a = reinterpret_cast<const sockaddr_in&>(bound).sin_addr;
    if (host_v6) return "an IPv4 socket, which " + host + " (IPv6) cannot reach";
    if (a.s_addr == htonl(INADDR_ANY) || a.s_addr == v4.s_addr) return "";
    ::inet_ntop(AF_INET, &a, text, sizeof(text));
    return "bound to " + std::string(text) + ", not to " + host + " or 0.0.0.0";
  }
  const auto& a = reinterpret_cast<const sockaddr_in6&>(bound).sin6_addr;
  const bool any = IN6_IS_ADDR_UNSPECIFIED(&a);
  if (host_v6 && (any || IN6_ARE_ADDR_EQUAL(&a, &v6))) return "";
  if (host_v4) {
    int v6only = 0;
    sockopt_int(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only);
    if (any && v6only == 0) return "";  // dual-stack: IPv4 arrives as ::ffff:a.b.c.d
    if (IN6_IS_ADDR_V4MAPPED(&a) && std::memcmp(&a.s6_addr[12], &v4.s_addr, 4) == 0) return "";
    if (any) return "an IPv6-only socket (IPV6_V6ONLY), which " + host + " (IPv4) cannot reach";
  }
  ::inet_ntop(AF_INET6, &a, text, sizeof(text));
  return "bound to " + std::string(text) + ", not to " + host + " or ::";
}

}  // namespace

std::string listener_problem(int fd, int port, const std::string& host) {
  const std::string name = "descriptor " + std::to_string(fd);
  if (fd < 0 || ::fcntl(fd, F_GETFD) < 0) {
    return name + " is not open in this process (closed, or not inherited: was it "
                  "close-on-exec in the launcher?)";
  }
  int type = 0;
  if (sockopt_int(fd, SOL_SOCKET, SO_TYPE, &type) != 0) {
    return errno == ENOTSOCK ? name + " is " + kind_of(fd) + ", not a socket"
                             : name + ": getsockopt: " + std::strerror(errno);
  }
  int domain = 0;
  int protocol = 0;
  sockopt_int(fd, SOL_SOCKET, SO_DOMAIN, &domain);
  sockopt_int(fd, SOL_SOCKET, SO_PROTOCOL, &protocol);
  if ((domain != AF_INET && domain != AF_INET6) || type != SOCK_STREAM ||
      protocol != IPPROTO_TCP) {
    return name + " is a socket but not a TCP one (" +
           (domain == AF_UNIX ? std::string("a Unix-domain socket")
                              : "domain " + std::to_string(domain) + ", type " +
                                    std::to_string(type)) + ")";
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len) != 0) {
    return name + ": getsockname: " + std::strerror(errno);
  }
  const int have = bound.ss_family == AF_INET6
                       ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                       : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  int listening = 0;
  sockopt_int(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening);
  if (listening == 0) {
    return name + " is a TCP socket " +
           (have == 0 ? std::string("bound to no port") : "bound to port " + std::to_string(have)) +
           " but not listening (no listen(2))";
  }
  if (port != 0 && have != port) {
    return name + " is listening on port " + std::to_string(have) + ", not " +
           std::to_string(port);
  }
  const std::string unreachable = reach_problem(bound, fd, host);
  if (!unreachable.empty()) return name + " (port " + std::to_string(have) + ") is " + unreachable;
  return "";
}

Socket adopt_listener(int fd) {
  ::fcntl(fd, F_SETFD, ::fcntl(fd, F_GETFD) | FD_CLOEXEC);
  // As listen_tcp's: the connections accepted from it inherit SO_REUSEADDR, so that a rebuilt
  // communicator can bind the port again while they are still in TIME_WAIT.
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  set_nonblocking(fd);
  return Socket(fd);
}

namespace {

// The loopback address for the reserved localhost names, or nullptr for any other host.
const char* loopback_literal(const std::string& host) {
  std::string lower;
  for (char c : host) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "localhost" || lower == "localhost.localdomain") return "127.0.0.1";
  if (lower == "ip6-localhost" || lower == "ip6-loopback") return "::1";
  return nullptr;
}

bool is_self_connection(int fd) {
  sockaddr_storage local{}, peer{};
  socklen_t local_len = sizeof(local), peer_len = sizeof(peer);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) != 0 ||
      ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) {
    return false;
  }
  return local_len == peer_len && std::memcmp(&local, &peer, local_len) == 0;
}

// One connection attempt to any resolved address; returns a connected socket or sets *err.
// *fatal: a failure that no retry can cure (out of descriptors).
Socket try_connect(const std::string& host, int port, Deadline deadline, std::string* err,
                   bool* fatal) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  std::string service = std::to_string(port);
  int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0 && loopback_literal(host) != nullptr) {
    // RFC 6761: "localhost" always means the loopback interface, even on a system without
    // /etc/hosts (a bare container or chroot) whose DNS does not answer for it.
    rc = ::getaddrinfo(loopback_literal(host), service.c_str(), &hints, &res);
  }
  if (rc != 0) {
    *err = std::string("cannot resolve host: ") + ::gai_strerror(rc);
    return Socket();
  }
  Socket result;
  for (addrinfo* ai = res; ai != nullptr && !result.valid(); ai = ai->ai_next) {
    Socket s(::socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!s.valid()) {
      *err = errno_description(errno);
      if (descriptors_exhausted(errno)) *fatal = true;  // Note [descriptor budget]: no retry
      continue;
    }
    set_nonblocking(s.fd());
    if (::connect(s.fd(), ai->ai_addr, ai->ai_addrlen) != 0 && errno != EINPROGRESS) {
      *err = std::strerror(errno);
      continue;
    }
    // At most 5 s per attempt, but at least 50 ms past the caller's deadline: the last attempt
    // of a retry loop starts just before it, and without the margin it would report "timed out"
    // instead of the refusal the peer's host sends back within microseconds.
    Deadline attempt = std::max(std::min(deadline, deadline_after(5.0)), deadline_after(0.05));
    if (wait_fd(s.fd(), POLLOUT, attempt).status != IoStatus::kOk) {
      *err = "connect attempt timed out";
      continue;
    }
    int so_error = 0;
    socklen_t len = sizeof(so_error);
    ::getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &so_error, &len);
    if (so_error != 0) {
      *err = std::strerror(so_error);
      continue;
    }
    if (is_self_connection(s.fd())) {
      // TCP simultaneous open: a loopback connect to a port in the ephemeral range can connect
      // to itself while the peer is not listening yet. Treat it as "refused" and retry.
      *err = "connection refused (self-connection)";
      continue;
    }
    result = std::move(s);
  }
  ::freeaddrinfo(res);
  return result;
}

}  // namespace

Socket connect_tcp(const std::string& host, int port, Deadline deadline, std::string* last_error,
                   bool* exhausted) {
  auto backoff = std::chrono::milliseconds(10);
  for (;;) {
    bool fatal = false;
    Socket s = try_connect(host, port, deadline, last_error, &fatal);
    if (s.valid()) return s;
    if (exhausted != nullptr) *exhausted = fatal;
    if (fatal || Clock::now() + backoff >= deadline) return Socket();
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }
}

Socket accept_until(const Socket& listener, Deadline deadline, IoResult* result) {
  for (;;) {
    int fd = ::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) {
      *result = {};
      return Socket(fd);
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED) {
      *result = {IoStatus::kError, errno};
      return Socket();
    }
    IoResult w = wait_fd(listener.fd(), POLLIN, deadline);
    if (w.status != IoStatus::kOk) {
      *result = w;
      return Socket();
    }
  }
}

IoResult read_exact(int fd, void* data, std::size_t bytes, Deadline deadline) {
  auto* p = static_cast<char*>(data);
  while (bytes > 0) {
    ssize_t n = ::recv(fd, p, bytes, MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      bytes -= static_cast<std::size_t>(n);
      continue;
    }
    if (n == 0) return {IoStatus::kClosed, 0};
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return {IoStatus::kError, errno};
    IoResult w = wait_fd(fd, POLLIN, deadline);
    if (w.status != IoStatus::kOk) return w;
  }
  return {};
}

IoResult write_exact(int fd, const void* data, std::size_t bytes, Deadline deadline) {
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = ::send(fd, p, bytes, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      p += n;
      bytes -= static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      if (errno == EPIPE || errno == ECONNRESET) return {IoStatus::kClosed, errno};
      return {IoStatus::kError, errno};
    }
    IoResult w = wait_fd(fd, POLLOUT, deadline);
    if (w.status != IoStatus::kOk) return w;
  }
  return {};
}

void tune_stream_socket(int fd) {
  set_nonblocking(fd);
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  // Socket buffers are left to the kernel's autotuning: fixed 4 MiB buffers measured no better
  // on loopback and disable autotuning on real links.
}

}  // namespace mwms::common
